// `linear`, the fallback: any M, any K % 8 == 0 (the int4 layout's own requirement), any group
// size; f16, int4 (Q4) or int8 (Q8) weights. One thread per output element, fp32 all the way, the kernel_abi semantics read literally.
// Slow; the rules use it only where the fast kernels' shape requirements fail.
//
// Launch: grid (ceil(N / 128), M), block 128, no dynamic shared memory.
#pragma once

#include "linear_common.cuh"

namespace grokc {
namespace ref {

using namespace linear;

constexpr int THREADS = 128;

// W[row, k] as the f32 value every kernel must see (abi/int4.dequantize for int4,
// abi/int8.dequantize for int8).
template <int WF>
__device__ __forceinline__ float weight_at(const void* weight, const __half* scales, const __half* zeros,
                                           int row, int k, int K, int group_size) {
    if (WF == F16) return __half2float(static_cast<const __half*>(weight)[static_cast<size_t>(row) * K + k]);
    const unsigned char* w = static_cast<const unsigned char*>(weight);
    float code, symmetric_zero;
    if (WF == Q8) {
        code = static_cast<float>(w[static_cast<size_t>(row) * K + k]);
        symmetric_zero = 128.f;
    } else {
        const uint32_t word = reinterpret_cast<const uint32_t*>(w + static_cast<size_t>(row) * (K / 2))[k / 8];
        const int j = k % 8;
        const int nibble = (j & 1) ? 4 + j / 2 : j / 2;  // codes e0..e7 sit in nibbles 0 4 1 5 2 6 3 7
        code = static_cast<float>((word >> (4 * nibble)) & 0xFu);
        symmetric_zero = 8.f;
    }
    const int gs = group_size > 0 ? group_size : K;
    const int G = (K + gs - 1) / gs;
    const size_t gi = static_cast<size_t>(row) * G + k / gs;
    const float zero = zeros != nullptr ? __half2float(zeros[gi]) : symmetric_zero;
    return (code - zero) * __half2float(scales[gi]);
}

template <int WF, int ACT, bool OUT_F32, int IO = 0>
__device__ __forceinline__ void linear_ref(GROKC_LINEAR_PARAMS) {
    __shared__ float partial[THREADS / 32];
    __shared__ float rstd;
    const int m = blockIdx.y, n = blockIdx.x * THREADS + threadIdx.x;
    const size_t xr = static_cast<size_t>(m) * K;
    if (norm != nullptr) {
        float s = 0.f;
        for (int k = threadIdx.x; k < K; k += THREADS) s = fmaf(x_at<IO>(x, xr + k), x_at<IO>(x, xr + k), s);
        s = warp_sum(s);
        if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.f;
            for (int w = 0; w < THREADS / 32; ++w) t += partial[w];
            rstd = rsqrtf(t / static_cast<float>(K) + eps);
        }
        __syncthreads();
    }
    if (n >= N) return;
    const float r = norm != nullptr ? rstd : 1.f;
    float gate = 0.f, up = 0.f;
    for (int k = 0; k < K; ++k) {
        float xv = x_at<IO>(x, xr + k);
        if (norm != nullptr) xv = xv * r * __half2float(norm[k]);
        gate = fmaf(xv, weight_at<WF>(weight, scales, zeros, n, k, K, group_size), gate);
        if (ACT != NONE) up = fmaf(xv, weight_at<WF>(weight, scales, zeros, N + n, k, K, group_size), up);
    }
    finish<ACT, OUT_F32, IO>(out, residual, addend, bias, m, n, N, gate, up);
}

}  // namespace ref
}  // namespace grokc
