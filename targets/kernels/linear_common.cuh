// Definitions shared by the `linear` kernels (artifacts/kernel_abi.py is the spec):
//   out = epilogue(prologue(x) @ W^T), W f16 [NW, K], int4 [NW, K/2] or int8 [NW, K] with f16 scales/zeros.
#pragma once

#include "common.cuh"

namespace grokc {
namespace linear {

// Weight format, as a template argument. Q4: one scale (and zero) per row (group_size == 0 or
// >= K), applied to the finished dot product. Q4G: groups of group_size (a multiple of 32) along
// K, scale and zero folded into the dequantised weights. Q8: int8 codes (abi/int8.py), one
// byte each, any group size in linear_ref, one scale (and zero) per row in linear_gemv2; the gemv
// and gemm families do not read it.
enum WFormat { F16 = 0, Q4 = 1, Q4G = 2, Q8 = 3 };
// Gated activations (SILU_MUL, GELU_MUL) read NW = 2N weight rows: gate rows, then up rows.
enum Act { NONE = 0, SILU_MUL = 1, GELU_MUL = 2 };
// Input dtypes (kernel_abi's x_dtype / residual_dtype), as a template argument: bit X32 set, x is
// f32; bit R32, the residual is. An f32 input is rounded to f16 as it is read, so it means what the
// f16 tensor it stands for would (the batch-1 decode graph keeps its layer outputs in f32 sums).
enum InDtypes { X32 = 1, R32 = 2 };

template <int IO>
__device__ __forceinline__ float x_at(const __half* x, size_t i) {
    return (IO & X32) ? __half2float(__float2half_rn(reinterpret_cast<const float*>(x)[i])) : __half2float(x[i]);
}
template <int IO>
__device__ __forceinline__ float residual_at(const __half* residual, size_t i) {
    return (IO & R32) ? __half2float(__float2half_rn(reinterpret_cast<const float*>(residual)[i]))
                      : __half2float(residual[i]);
}
// 8 halves of x from 8 f32 (two 16-byte loads), rounded as x_at does.
__device__ __forceinline__ uint4 f32x8_to_h8(const float4 a, const float4 b) {
    uint4 r;
    r.x = h2_as_u32(__floats2half2_rn(a.x, a.y));
    r.y = h2_as_u32(__floats2half2_rn(a.z, a.w));
    r.z = h2_as_u32(__floats2half2_rn(b.x, b.y));
    r.w = h2_as_u32(__floats2half2_rn(b.z, b.w));
    return r;
}

__device__ __forceinline__ void store(void* out, size_t i, float v, bool f32) {
    if (f32)
        static_cast<float*>(out)[i] = v;
    else
        static_cast<__half*>(out)[i] = __float2half_rn(v);
}

// The tanh approximation of GELU (gelu_pytorch_tanh), as abi/ops.py writes it.
__device__ __forceinline__ float gelu_tanh(float v) {
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

// The activation a gated ACT applies to the gate rows.
template <int ACT>
__device__ __forceinline__ float gate_act(float gate) {
    return ACT == GELU_MUL ? gelu_tanh(gate) : silu(gate);
}

// What joins weight row `row`'s finished dot product for output row m before the activation:
// addend[m, row] (f32 [M, NW], NW = 2N when gated), the sparse f16 residual's product (kernel_abi
// "sparse_residual"), plus bias[row] (f16 [NW]); null pointers count as 0.
template <int ACT>
__device__ __forceinline__ float addend_at(const float* addend, const __half* bias, int m, int row, int N) {
    const int nw = (ACT != NONE) ? 2 * N : N;
    const float a = addend == nullptr ? 0.f : addend[static_cast<size_t>(m) * nw + row];
    return bias == nullptr ? a : a + __half2float(bias[row]);
}

// Output element (m, n) before the residual, from its raw dot products `gate` (and `up` when
// gated), each already multiplied by its row scale and rms factor: the addend and bias of each row
// join them, then the activation.
template <int ACT>
__device__ __forceinline__ float activated(const float* addend, const __half* bias, int m, int n, int N, float gate,
                                           float up) {
    gate += addend_at<ACT>(addend, bias, m, n, N);
    if (ACT != NONE) up += addend_at<ACT>(addend, bias, m, N + n, N);
    return (ACT != NONE) ? gate_act<ACT>(gate) * up : gate;
}

// The last step every kernel shares, for one output element: activated, plus the residual, stored.
template <int ACT, bool OUT_F32, int IO = 0>
__device__ __forceinline__ void finish(void* out, const __half* residual, const float* addend, const __half* bias,
                                       int m, int n, int N, float gate, float up) {
    float v = activated<ACT>(addend, bias, m, n, N, gate, up);
    const size_t i = static_cast<size_t>(m) * N + n;
    if (residual != nullptr) v += residual_at<IO>(residual, i);  // out may alias residual: read first
    store(out, i, v, OUT_F32);
}

// Two adjacent outputs of one thread in a tensor-core fragment: row m, columns n (even) and n + 1,
// their raw dot products gate[0..1] (overwritten with the outputs) and, when gated, up[0..1].
struct OutPair {
    int m, n;
    float rs;  // the rms factor of row m (1 without a norm)
    float* gate;
    const float* up;
};

// finish for a thread's P pairs (pair_at(p) -> OutPair, p < P) in three passes: values, residuals,
// stores. No load waits behind a store (out may alias residual, and the compiler cannot tell scales
// or addend from out), so each pass's loads are in flight together: element by element, every load
// waited behind the last store (on the H200, 12 us of a 128 x 128 wgmma tile). Q: times the row
// scales; f16 outputs stored in pairs where N is even.
template <int ACT, bool OUT_F32, bool Q, int P, class PairAt>
__device__ __forceinline__ void finish_pairs(void* out, const __half* residual, const float* addend, const __half* bias,
                                             const __half* scales, int M, int N, PairAt pair_at) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const OutPair o = pair_at(p);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int n = o.n + e;
            if (o.m >= M || n >= N) continue;
            float gate = o.gate[e], up = ACT != NONE ? o.up[e] : 0.f;
            if (Q) {
                gate *= __half2float(scales[n]);
                if (ACT != NONE) up *= __half2float(scales[N + n]);
            }
            o.gate[e] = activated<ACT>(addend, bias, o.m, n, N, gate * o.rs, up * o.rs);
        }
    }
    if (residual != nullptr) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const OutPair o = pair_at(p);
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (o.m < M && o.n + e < N) o.gate[e] += residual_at<0>(residual, static_cast<size_t>(o.m) * N + o.n + e);
        }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const OutPair o = pair_at(p);
        if (o.m >= M) continue;
        const size_t i = static_cast<size_t>(o.m) * N + o.n;
        if (!OUT_F32 && o.n + 1 < N && (N & 1) == 0) {
            *reinterpret_cast<__half2*>(static_cast<__half*>(out) + i) = __floats2half2_rn(o.gate[0], o.gate[1]);
        } else {
            if (o.n < N) store(out, i, o.gate[0], OUT_F32);
            if (o.n + 1 < N) store(out, i + 1, o.gate[1], OUT_F32);
        }
    }
}

}  // namespace linear
}  // namespace grokc

// The C signature every linear kernel has (KERNEL_ABI["linear"], in order). `out` and `residual`
// may alias, so neither is __restrict__.
#define GROKC_LINEAR_PARAMS                                                                         \
    void *out, const __half *__restrict__ x, const void *__restrict__ weight,                       \
        const __half *__restrict__ scales, const __half *__restrict__ zeros,                        \
        const __half *__restrict__ norm, const __half *residual, const float *__restrict__ addend,    \
        const __half *__restrict__ bias, int M, int N, int K, int group_size, float eps
#define GROKC_LINEAR_ARGS out, x, weight, scales, zeros, norm, residual, addend, bias, M, N, K, group_size, eps
