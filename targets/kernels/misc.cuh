// embedding and take_last (artifacts/kernel_abi.py): row copies, 16 bytes per thread per step.
//
// embedding_rows<VEC>: grid (n, 1, 1), one block per token; a token outside [0, vocab) gives a zero
//   row. VEC = 8 copies 8 halves at a time (hidden % 8 == 0, 16-byte aligned rows); VEC = 1 is the
//   any-width fallback.
// take_last_row<VEC>: grid (1, 1, 1): out[0] = x[n_real[0] - 1] (a zero row if n_real[0] < 1).
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace grokc_misc {

template <int VEC>
__device__ __forceinline__ void copy_row(half* dst, const half* src, int hidden) {
  if constexpr (VEC == 8) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) d[c] = s ? __ldg(s + c) : make_uint4(0, 0, 0, 0);
  } else {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = src ? src[c] : __float2half_rn(0.f);
  }
}

template <int VEC>
__device__ __forceinline__ void embedding_rows(half* out, const int* tokens, const half* table, int n,
                                               int hidden, int vocab) {
  const int i = blockIdx.x;
  if (i >= n) return;
  const int tok = __ldg(tokens + i);
  const half* src = (tok >= 0 && tok < vocab) ? table + (size_t)tok * hidden : nullptr;
  copy_row<VEC>(out + (size_t)i * hidden, src, hidden);
}

template <int VEC>
__device__ __forceinline__ void take_last_row(half* out, const half* x, const int* n_real, int hidden) {
  const int t = __ldg(n_real) - 1;
  copy_row<VEC>(out, t >= 0 ? x + (size_t)t * hidden : nullptr, hidden);
}

}  // namespace grokc_misc
