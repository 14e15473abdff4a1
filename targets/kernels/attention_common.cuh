// Helpers shared by the attention kernels (attention_prefill.cuh, attention_decode.cuh):
// tensor-core fragments (mma.sync m16n8k16, ldmatrix), cp.async, the swizzled shared-memory tile
// layout, and RoPE exactly as artifacts/kernel_abi.py states it.
//
// Everything lives in namespace grokc_attn so it can sit in one translation unit with the other
// op families' headers.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace grokc_attn {

constexpr int kKvBlock = 16;                     // kernel_abi.KV_BLOCK_SIZE: tokens per cache block
constexpr float kLog2e = 1.4426950408889634f;

// -- shared memory, async copies ----------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when !pred nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tiles of rows of CH 16-byte chunks (8 halves each). Chunk c of row r sits at c ^ (r & 7) so that
// the 8 row addresses an ldmatrix phase reads fall in 8 different 16-byte bank groups.
template <int CH>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * CH + (chunk ^ (row & 7));
}

// -- tensor cores -------------------------------------------------------------------------------

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a (16x16, row-major) * b (16x8, column-major), f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// -- RoPE ---------------------------------------------------------------------------------------
// (cos, sin) at position pos for frequency index i: rope_table[pos, i] below table_len, else
// mscale * (cosf, sinf)(pos * inv_freq[i]) in f32 (kernel_abi.py). Rotated values are computed
// with explicitly rounded f32 operations (no fused multiply-add), as numpy computes them.

__device__ __forceinline__ float2 rope_cs(const float* table, const float* inv_freq, int table_len,
                                          float mscale, int pos, int half_dim, int i) {
  if (pos < table_len) {
    return __ldg(reinterpret_cast<const float2*>(table) + (size_t)pos * half_dim + i);
  }
  float s, c;
  sincosf(__fmul_rn(static_cast<float>(pos), __ldg(inv_freq + i)), &s, &c);
  return make_float2(__fmul_rn(mscale, c), __fmul_rn(mscale, s));
}

// (cos, sin) for the 8 frequencies i0..i0+7 (i0 a multiple of 8): cs[2j] = cos, cs[2j+1] = sin.
__device__ __forceinline__ void rope_cs8(float (&cs)[16], const float* table, const float* inv_freq,
                                         int table_len, float mscale, int pos, int half_dim, int i0) {
  if (pos < table_len) {
    const float4* t = reinterpret_cast<const float4*>(table + ((size_t)pos * half_dim + i0) * 2);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float4 v = __ldg(t + k);
      cs[4 * k] = v.x, cs[4 * k + 1] = v.y, cs[4 * k + 2] = v.z, cs[4 * k + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float s, c;
      sincosf(__fmul_rn(static_cast<float>(pos), __ldg(inv_freq + i0 + j)), &s, &c);
      cs[2 * j] = __fmul_rn(mscale, c);
      cs[2 * j + 1] = __fmul_rn(mscale, s);
    }
  }
}

// One rotate-half pair in f32: (x1*c - x2*s, x2*c + x1*s).
__device__ __forceinline__ float2 rope_pair(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)),
                     __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

// Rotate 8 pairs in place: x1 holds dims i0..i0+7 of the first half, x2 the same of the second.
__device__ __forceinline__ void rope_rotate8(uint4& x1, uint4& x2, const float (&cs)[16]) {
  __half2* a = reinterpret_cast<__half2*>(&x1);
  __half2* b = reinterpret_cast<__half2*>(&x2);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 fa = __half22float2(a[j]), fb = __half22float2(b[j]);
    float2 lo = rope_pair(fa.x, fb.x, cs[4 * j], cs[4 * j + 1]);
    float2 hi = rope_pair(fa.y, fb.y, cs[4 * j + 2], cs[4 * j + 3]);
    a[j] = __floats2half2_rn(lo.x, hi.x);
    b[j] = __floats2half2_rn(lo.y, hi.y);
  }
}

// Address of position pos of kv head kvh of a slot whose block-table row is bt (f16 [NB, NKV, S, D]).
__device__ __forceinline__ size_t cache_offset(const int* bt, int pos, int n_kv_heads, int kvh, int head_dim) {
  const int blk = __ldg(bt + pos / kKvBlock);
  return (((size_t)blk * n_kv_heads + kvh) * kKvBlock + (pos % kKvBlock)) * head_dim;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The log2-domain score of a raw q.k product: dot * scale * log2(e), or with softcap > 0 (Grok-1)
// softcap * tanhf(dot * scale / softcap) * log2(e). Callers hoist the constants: sl2 = scale * kLog2e,
// cap_l2 = softcap * kLog2e, inv_cap = scale / softcap (unused when softcap == 0).
__device__ __forceinline__ float score_log2(float dot, float sl2, float softcap, float cap_l2, float inv_cap) {
  return softcap > 0.f ? cap_l2 * tanhf(dot * inv_cap) : dot * sl2;
}

// Online-softmax step for the two rows (g, g+8) a thread holds in an m16n8 accumulator tile set:
// s[NT][4] are scores already in the log2 domain (masked ones -inf). Rescales o and l, turns s into
// probabilities, and returns nothing; m and l are per-thread running max / partial sums.
template <int NT, int NO>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&o)[NO][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.f : mx;  // a row with every key masked so far
    const float alpha = exp2f(m[r] - base);
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][2 * r] = exp2f(s[nt][2 * r] - base);
      s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - base);
      sum += s[nt][2 * r] + s[nt][2 * r + 1];
    }
    l[r] = l[r] * alpha + sum;
#pragma unroll
    for (int d = 0; d < NO; ++d) {
      o[d][2 * r] *= alpha;
      o[d][2 * r + 1] *= alpha;
    }
  }
}

}  // namespace grokc_attn
