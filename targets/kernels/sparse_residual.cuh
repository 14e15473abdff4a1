// sparse_residual (artifacts/kernel_abi.py): out[m, n] = sum over row n of a CSR of
// vals[e] * xn[m, cols[e]], xn = x RMS-normalised by norm (when norm is not null): the product of
// the fp16 corrections of an int4 weight, which the linear after it adds to its dot products.
//
// grid (ceil(NW / kRows), ceil(M / MT)), block kThreads (8 warps). A block takes MT rows of x:
// their sums of squares by a block reduction, then (STAGE) the rows as f32 xn in dynamic shared
// memory, MT * K * 4 bytes, or (no STAGE, MT == 1, for K too wide to stage) read from global
// memory per entry. Warp w sums the output rows blockIdx.x * kRows + w, + 8, ...: its lanes stride
// over the row's entries, each entry read once for all MT rows of x, and a shuffle tree finishes
// every sum (a fixed order: the same bits every run). A row with no entries writes 0.
#pragma once

#include <cuda_fp16.h>

namespace grokc_sparse {

constexpr int kThreads = 256;
constexpr int kRows = 64;  // output rows per block

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int MT, bool STAGE>
__device__ __forceinline__ void sparse_residual_rows(float* out, const half* x, const half* norm, const int* rowptr,
                                                     const int* cols, const half* vals, int M, int NW, int K,
                                                     float eps) {
  static_assert(STAGE || MT == 1, "unstaged rows read x one row at a time");
  extern __shared__ float xs[];                  // [MT][K] with STAGE
  __shared__ float partial[kThreads / 32][MT];
  __shared__ float scale[MT];                    // rsqrt(mean(x^2) + eps), or 1 without a norm
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = blockIdx.y * MT;
  const int mt = min(MT, M - m0);

  float ss[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    ss[i] = 0.f;
    for (int k = tid; k < K; k += kThreads) {
      const float v = i < mt ? __half2float(x[static_cast<size_t>(m0 + i) * K + k]) : 0.f;
      if (STAGE) xs[i * K + k] = v;
      ss[i] = fmaf(v, v, ss[i]);
    }
    ss[i] = warp_sum(ss[i]);
    if (lane == 0) partial[warp][i] = ss[i];
  }
  __syncthreads();
  if (tid < MT) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) t += partial[w][tid];
    scale[tid] = norm != nullptr ? rsqrtf(t / static_cast<float>(K) + eps) : 1.f;
  }
  __syncthreads();
  if (STAGE && norm != nullptr) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
      for (int k = tid; k < K; k += kThreads) xs[i * K + k] *= scale[i] * __half2float(norm[k]);
    __syncthreads();
  }

  const int n_end = min(NW, (blockIdx.x + 1) * kRows);
  for (int n = blockIdx.x * kRows + warp; n < n_end; n += kThreads / 32) {
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[i] = 0.f;
    const int e_end = __ldg(rowptr + n + 1);
    for (int e = __ldg(rowptr + n) + lane; e < e_end; e += 32) {
      const float v = __half2float(vals[e]);
      const int c = __ldg(cols + e);
      if (STAGE) {
#pragma unroll
        for (int i = 0; i < MT; ++i) acc[i] = fmaf(v, xs[i * K + c], acc[i]);
      } else {
        float xv = __half2float(x[static_cast<size_t>(m0) * K + c]) * scale[0];
        if (norm != nullptr) xv *= __half2float(norm[c]);
        acc[0] = fmaf(v, xv, acc[0]);
      }
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      acc[i] = warp_sum(acc[i]);
      if (lane == 0 && i < mt) out[static_cast<size_t>(m0 + i) * NW + n] = acc[i];
    }
  }
}

}  // namespace grokc_sparse
