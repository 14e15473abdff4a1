// linear_rows: M = 1, f16 weights, act none (the LM head of a batch-1 decode step). One warp per
// weight row at a time, its 32 lanes reading 512 contiguous bytes of the row per instruction
// (16-byte chunk c = lane + 32 u): the access pattern of TVM dlight's GEMV, which reads the 525 MB
// f16 head of the Llama-3.2-1B shape at 4.5 TB/s on the H200 where gemv2's MMA fragments (64 bytes
// of each of 8 rows per instruction) reach 4.1 (docs/kernels-linear.md).
//
// Persistent grid: warp w of block b takes rows b * W + w, then + gridDim.x * W, ... Each lane keeps
// U 16-byte loads of its row in flight (a whole row while K <= 256 U) and issues the next row's first
// U before it reduces the current one; the first row's loads go out before griddepcontrol.wait
// (weights do not depend on the launch before). x, times norm when there is one, is staged in shared
// memory once per block, rounded to f16 as gemv2 does; products and sums are fp32. The rms factor
// of the norm multiplies the finished dot product.
#pragma once

namespace grokc {
namespace rows {

using namespace linear;

// sum over 8 of f32(w_i) * f32(x_i), added to acc
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __half22float2(u32_as_h2(ws[i])), b = __half22float2(u32_as_h2(xs[i]));
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
    }
    return acc;
}

template <int W, int U, bool OUT_F32, int TR, int IO = 0>
__device__ __forceinline__ void linear_rows(GROKC_LINEAR_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nch = K / 8;                                // 16-byte chunks of a row (K % 8 == 0)
    uint4* xs = reinterpret_cast<uint4*>(smem);           // [nch] x (times norm), f16
    float* wsum = reinterpret_cast<float*>(xs + nch);     // [W] sums of squares of x
    const uint4* w0 = static_cast<const uint4*>(weight);

    if (TR == 0) grokc_pdl_launch_dependents();

    uint4 ring[U];
    auto load = [&](int row, int c0) {
        const uint4* wr = w0 + static_cast<size_t>(row) * nch;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + lane + 32 * u;
            ring[u] = c < nch ? ldg_stream(wr + c) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    const int stride = gridDim.x * W;
    int row = blockIdx.x * W + warp;
    if (row < N) load(row, 0);

    grokc_pdl_wait();  // the previous kernel's x / norm / residual are complete from here on
    if (TR == 1) grokc_pdl_launch_dependents();

    const uint4* xg = reinterpret_cast<const uint4*>(x);
    const uint4* ng = reinterpret_cast<const uint4*>(norm);
    float ss = 0.f;
    const float4* xg32 = reinterpret_cast<const float4*>(x);
    for (int c = tid; c < nch; c += 32 * W) {
        uint4 v = (IO & X32) ? f32x8_to_h8(__ldg(xg32 + 2 * c), __ldg(xg32 + 2 * c + 1)) : ldg16(xg + c);
        if (norm != nullptr) {
            ss += sumsq8(v);
            v = hmul8(v, ldg16(ng + c));
        }
        xs[c] = v;
    }
    ss = warp_sum(ss);
    if (lane == 0) wsum[warp] = ss;
    __syncthreads();
    float rs = 1.f;
    if (norm != nullptr) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) total += wsum[w];
        rs = rsqrtf(total / static_cast<float>(K) + eps);
    }

    for (; row < N; row += stride) {
        float acc = 0.f;
        for (int c0 = 0; c0 < nch; c0 += 32 * U) {
            if (c0 > 0) load(row, c0);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0 + lane + 32 * u;
                if (c < nch) acc = dot8(ring[u], xs[c], acc);
            }
        }
        if (row + stride < N) load(row + stride, 0);
        acc = warp_sum(acc);
        if (lane == 0) finish<NONE, OUT_F32, IO>(out, residual, addend, bias, 0, row, N, acc * rs, 0.f);
    }
}

}  // namespace rows
}  // namespace grokc
