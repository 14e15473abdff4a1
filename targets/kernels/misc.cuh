// embedding and take_last (artifacts/kernel_abi.py): row copies, 16 bytes per thread per step.
//
// embedding_rows<VEC>: f16 table; grid (n, 1, 1), one block per token; a token outside [0, vocab)
//   gives a zero row. VEC = 8 copies 8 halves at a time (hidden % 8 == 0, 16-byte aligned rows);
//   VEC = 1 is the any-width fallback.
// embedding_q4_rows<WORDS>: packed int4 table (artifacts/int4.py), one block per token; each thread
//   step reads WORDS 32-bit words (WORDS = 4: one 16-byte load, hidden % 32 == 0; WORDS = 1:
//   hidden % 8 == 0) and writes 8 halves per word with one 16-byte store.
// embedding_q8_rows<VEC>: u8 codes, one block per token; VEC = 8 reads 8 codes (8 bytes) and writes
//   8 halves per step (hidden % 8 == 0); VEC = 1 is the any-width fallback.
//   Both quantized kernels compute (code - zero) * scale in f32 and round to f16 once, as the ABI
//   says; group_size is 0 or a multiple of 8, so the 8 codes of a step share one scale.
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
__device__ __forceinline__ void embedding_rows(half* out, const int* tokens, const void* table, const half* scales,
                                               const half* zeros, int n, int hidden, int vocab, int group_size) {
  const int i = blockIdx.x;
  if (i >= n) return;
  const int tok = __ldg(tokens + i);
  const half* src = (tok >= 0 && tok < vocab) ? static_cast<const half*>(table) + (size_t)tok * hidden : nullptr;
  copy_row<VEC>(out + (size_t)i * hidden, src, hidden);
}

// 8 codes (as floats) -> 8 halves (c - zero) * scale, f32 math rounded once (no contraction).
__device__ __forceinline__ uint4 dequant8(const float c[8], float zero, float scale) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __floats2half2_rn(__fmul_rn(__fsub_rn(c[2 * k], zero), scale),
                                        __fmul_rn(__fsub_rn(c[2 * k + 1], zero), scale));
    w[k] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The scale and zero of group g of row tok (zero: default_zero when zeros is null).
struct RowGrid {
  const half* scales;
  const half* zeros;
  float default_zero;
  __device__ __forceinline__ float scale(int g) const { return __half2float(scales[g]); }
  __device__ __forceinline__ float zero(int g) const { return zeros ? __half2float(zeros[g]) : default_zero; }
};

__device__ __forceinline__ RowGrid row_grid(const half* scales, const half* zeros, int tok, int hidden, int group_size,
                                            float default_zero) {
  const int gs = group_size > 0 ? group_size : hidden;
  const size_t G = (hidden + gs - 1) / gs;
  return {scales + tok * G, zeros ? zeros + tok * G : nullptr, default_zero};
}

template <int WORDS>
__device__ __forceinline__ void embedding_q4_rows(half* out, const int* tokens, const void* table, const half* scales,
                                                  const half* zeros, int n, int hidden, int vocab, int group_size) {
  const int i = blockIdx.x;
  if (i >= n) return;
  const int tok = __ldg(tokens + i);
  uint4* dst = reinterpret_cast<uint4*>(out + (size_t)i * hidden);   // 8 halves per word
  if (tok < 0 || tok >= vocab) {
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) dst[c] = make_uint4(0, 0, 0, 0);
    return;
  }
  const int gs = group_size > 0 ? group_size : hidden;
  const RowGrid grid = row_grid(scales, zeros, tok, hidden, group_size, 8.f);
  const uint32_t* row = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(table) + (size_t)tok * (hidden / 2));
  for (int s = threadIdx.x; s < hidden / (8 * WORDS); s += blockDim.x) {
    uint32_t w[WORDS];
    if constexpr (WORDS == 4) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + s);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      w[0] = __ldg(row + s);
    }
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
      const int word = s * WORDS + j;     // codes 8*word .. 8*word + 7 of the row
      const int g = 8 * word / gs;
      float c[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) c[k] = static_cast<float>((w[j] >> (4 * ((k & 1) ? 4 + k / 2 : k / 2))) & 0xFu);
      dst[word] = dequant8(c, grid.zero(g), grid.scale(g));   // nibbles 0..7 hold codes 0 2 4 6 1 3 5 7
    }
  }
}

template <int VEC>
__device__ __forceinline__ void embedding_q8_rows(half* out, const int* tokens, const void* table, const half* scales,
                                                  const half* zeros, int n, int hidden, int vocab, int group_size) {
  const int i = blockIdx.x;
  if (i >= n) return;
  const int tok = __ldg(tokens + i);
  half* dst = out + (size_t)i * hidden;
  if (tok < 0 || tok >= vocab) {
    copy_row<VEC>(dst, nullptr, hidden);
    return;
  }
  const int gs = group_size > 0 ? group_size : hidden;
  const RowGrid grid = row_grid(scales, zeros, tok, hidden, group_size, 128.f);
  const uint8_t* row = static_cast<const uint8_t*>(table) + (size_t)tok * hidden;
  if constexpr (VEC == 8) {
    for (int s = threadIdx.x; s < hidden / 8; s += blockDim.x) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row) + s);
      const int g = 8 * s / gs;
      float c[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) c[k] = static_cast<float>(((k < 4 ? v.x : v.y) >> (8 * (k & 3))) & 0xFFu);
      reinterpret_cast<uint4*>(dst)[s] = dequant8(c, grid.zero(g), grid.scale(g));
    }
  } else {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const int g = c / gs;
      dst[c] = __float2half_rn(__fmul_rn(__fsub_rn(static_cast<float>(__ldg(row + c)), grid.zero(g)), grid.scale(g)));
    }
  }
}

template <int VEC>
__device__ __forceinline__ void take_last_row(half* out, const half* x, const int* n_real, int hidden) {
  const int t = __ldg(n_real) - 1;
  copy_row<VEC>(out, t >= 0 ? x + (size_t)t * hidden : nullptr, hidden);
}

}  // namespace grokc_misc
