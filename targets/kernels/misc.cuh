// embedding, take_last, rms_norm and qk_norm (abi/ops.py): row copies, 16 bytes per thread per step,
// and row / head normalisations.
//
// embedding_rows<VEC>: f16 table; grid (n, 1, 1), one block per token; a token outside [0, vocab)
//   gives a zero row. VEC = 8 copies 8 halves at a time (hidden % 8 == 0, 16-byte aligned rows);
//   VEC = 1 is the any-width fallback. A scale other than 1 multiplies each half in f32 and rounds
//   once (Gemma's sqrt(hidden)).
// embedding_q4_rows<WORDS>: packed int4 table (abi/int4.py), one block per token; each thread
//   step reads WORDS 32-bit words (WORDS = 4: one 16-byte load, hidden % 32 == 0; WORDS = 1:
//   hidden % 8 == 0) and writes 8 halves per word with one 16-byte store.
// embedding_q8_rows<VEC>: u8 codes, one block per token; VEC = 8 reads 8 codes (8 bytes) and writes
//   8 halves per step (hidden % 8 == 0); VEC = 1 is the any-width fallback.
//   Both quantized kernels compute (code - zero) * scales * scale in f32 and round to f16 once, as
//   the ABI says; group_size is 0 or a multiple of 8, so the 8 codes of a step share one scale.
// take_last_row<VEC>: grid (1, 1, 1): out[0] = x[n_real[0] - 1] (a zero row if n_real[0] < 1).
// rms_norm_rows: grid (M, 1, 1), block 256: one row per block, the sum of squares reduced over the
//   block, then x * rsqrt(mean + eps) * weight (+ residual) in f32, rounded once.
// qk_norm_heads: grid (n_heads + 2 n_kv_heads, M, 1), block 32: one warp per (row, head); q and k
//   heads are normalised as rms_norm_rows does a row, v heads copied.
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

// A row times `scale` (f32 products rounded once); zeros when src is null.
template <int VEC>
__device__ __forceinline__ void scale_row(half* dst, const half* src, int hidden, float scale) {
  if constexpr (VEC == 8) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
      uint4 v = s ? __ldg(s + c) : make_uint4(0, 0, 0, 0);
      __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __half22float2(h[k]);
        h[k] = __floats2half2_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
      }
      d[c] = v;
    }
  } else {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
      dst[c] = __float2half_rn(src ? __fmul_rn(__half2float(src[c]), scale) : 0.f);
  }
}

template <int VEC>
__device__ __forceinline__ void embedding_rows(half* out, const int* tokens, const void* table, const half* scales,
                                               const half* zeros, int n, int hidden, int vocab, int group_size,
                                               float scale) {
  const int i = blockIdx.x;
  if (i >= n) return;
  const int tok = __ldg(tokens + i);
  const half* src = (tok >= 0 && tok < vocab) ? static_cast<const half*>(table) + (size_t)tok * hidden : nullptr;
  if (scale == 1.f)
    copy_row<VEC>(out + (size_t)i * hidden, src, hidden);
  else
    scale_row<VEC>(out + (size_t)i * hidden, src, hidden, scale);
}

// 8 codes (as floats) -> 8 halves (c - zero) * scale * row_scale, f32 math rounded once (no contraction).
__device__ __forceinline__ uint4 dequant8(const float c[8], float zero, float scale, float row_scale) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __floats2half2_rn(__fmul_rn(__fmul_rn(__fsub_rn(c[2 * k], zero), scale), row_scale),
                                        __fmul_rn(__fmul_rn(__fsub_rn(c[2 * k + 1], zero), scale), row_scale));
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
                                                  const half* zeros, int n, int hidden, int vocab, int group_size,
                                                  float scale) {
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
      dst[word] = dequant8(c, grid.zero(g), grid.scale(g), scale);   // nibbles 0..7 hold codes 0 2 4 6 1 3 5 7
    }
  }
}

template <int VEC>
__device__ __forceinline__ void embedding_q8_rows(half* out, const int* tokens, const void* table, const half* scales,
                                                  const half* zeros, int n, int hidden, int vocab, int group_size,
                                                  float scale) {
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
      reinterpret_cast<uint4*>(dst)[s] = dequant8(c, grid.zero(g), grid.scale(g), scale);
    }
  } else {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const int g = c / gs;
      dst[c] = __float2half_rn(
          __fmul_rn(__fmul_rn(__fsub_rn(static_cast<float>(__ldg(row + c)), grid.zero(g)), grid.scale(g)), scale));
    }
  }
}

template <int VEC>
__device__ __forceinline__ void take_last_row(half* out, const half* x, const int* n_real, int hidden) {
  const int t = __ldg(n_real) - 1;
  copy_row<VEC>(out, t >= 0 ? x + (size_t)t * hidden : nullptr, hidden);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out = x * rsqrt(mean(x^2) + eps) * weight (+ residual), one row per block of 256 threads.
__device__ __forceinline__ void rms_norm_rows(half* out, const half* x, const half* weight, const half* residual, int M,
                                              int hidden, float eps) {
  __shared__ float red[8];
  const int m = blockIdx.x;
  if (m >= M) return;
  const half* row = x + (size_t)m * hidden;
  float ss = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float v = __half2float(row[c]);
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  ss = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) ss += red[w];
  const float inv = rsqrtf(ss / hidden + eps);
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = __half2float(row[c]) * inv * __half2float(weight[c]);
    if (residual != nullptr) v += __half2float(residual[(size_t)m * hidden + c]);  // out may alias residual
    out[(size_t)m * hidden + c] = __float2half_rn(v);
  }
}

// One warp per (row, head) of qkv [M, NH + 2 NKV, D]: q heads by q_norm, k heads by k_norm, v copied.
__device__ __forceinline__ void qk_norm_heads(half* out, const half* qkv, const half* q_norm, const half* k_norm,
                                              int M, int n_heads, int n_kv_heads, int head_dim, float eps) {
  const int h = blockIdx.x, m = blockIdx.y, lane = threadIdx.x;
  const size_t base = ((size_t)m * (n_heads + 2 * n_kv_heads) + h) * head_dim;
  const half* src = qkv + base;
  half* dst = out + base;
  if (h >= n_heads + n_kv_heads) {
    for (int d = lane; d < head_dim; d += 32) dst[d] = src[d];
    return;
  }
  const half* w = h < n_heads ? q_norm : k_norm;
  float ss = 0.f;
  for (int d = lane; d < head_dim; d += 32) {
    const float v = __half2float(src[d]);
    ss = fmaf(v, v, ss);
  }
  const float inv = rsqrtf(warp_sum(ss) / head_dim + eps);
  for (int d = lane; d < head_dim; d += 32) dst[d] = __float2half_rn(__half2float(src[d]) * inv * __half2float(w[d]));
}

}  // namespace grokc_misc
