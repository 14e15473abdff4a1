// attention_prefill (artifacts/kernel_abi.py): one padded sequence of L tokens, fused RoPE, KV-cache
// write of the real rows, causal grouped-query attention, zero padding rows. One launch.
//
// attention_prefill_mma<D, BN>: flash attention on tensor cores (mma.sync m16n8k16, f32 accumulate).
//   grid (ceil(L / 64), n_heads), block 128 (4 warps x 16 query rows), dynamic smem
//   PrefillMma<D, BN>::kSmem. Each block owns 64 query rows of one head; it rotates its queries and,
//   tile by tile, the keys 0..min(last row, t_real - 1) itself, straight from qkv (never from the
//   cache), so no block reads what another writes. The block of the first query head of each kv
//   group also writes its own 64 rows' rotated k and v into the cache. Key tiles past t_real or
//   above the diagonal (or, with a window, wholly below every row's window) are never loaded. K goes
//   global -> registers -> rotate -> swizzled smem (the
//   next tile's loads are in flight during the current tile's math); V goes by cp.async, double
//   buffered. P is rounded to f16 for the P.V product (the usual flash-attention error, ~1e-3).
//
// attention_prefill_ref: the simple fallback for any even head_dim: grid (L, n_heads), block 128,
//   smem (L + head_dim) * 4 bytes: one block per (row, head), scores in shared memory, CUDA cores.
//
// window > 0 (a local layer): query t sees keys max(0, t - window + 1)..t only (abi/ops.py).
// softcap > 0 (Grok-1): every kernel caps the scaled scores, softcap * tanhf(s / softcap) (score_log2).
#pragma once

#include "attention_common.cuh"

namespace grokc_attn {

template <int D, int BN>
struct PrefillMma {
  static constexpr int kBM = 64;          // query rows per block
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCH = D / 8;       // 16-byte chunks per row
  static constexpr int kHC = kCH / 2;     // chunks per rotate-half
  static constexpr int kKItems = BN * kHC / kThreads;  // chunk pairs of one K tile per thread
  static constexpr int kSmem = (kBM + 4 * BN) * D * 2; // Q + 2 x (K, V) tiles, f16
  static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16");
  static_assert(BN % 16 == 0 && (BN * kHC) % kThreads == 0, "bad key tile");
};

template <int D, int BN>
__device__ __forceinline__ void attention_prefill_mma(
    half* out, const half* qkv, const float* rope_table, const float* inv_freq, half* k_cache,
    half* v_cache, const int* block_table, const int* slot, const int* n_real, int L, int n_heads,
    int n_kv_heads, int head_dim, int table_len, int max_blocks, int window, float scale, float mscale,
    float softcap) {
  using C = PrefillMma<D, BN>;
  constexpr int BM = C::kBM, CH = C::kCH, HC = C::kHC, NT = BN / 8, NO = D / 8;
  extern __shared__ uint4 smem_prefill[];
  uint4* sQ = smem_prefill;          // [BM][CH]
  uint4* sK = sQ + BM * CH;          // [2][BN][CH]
  uint4* sV = sK + 2 * BN * CH;      // [2][BN][CH]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tig = lane & 3;
  const int h = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;  // longest rows first: better tail
  const int q_end = min(q0 + BM, L);
  const int t_real = __ldg(n_real);
  const int group = n_heads / n_kv_heads, kvh = h / group;
  const size_t rs = (size_t)(n_heads + 2 * n_kv_heads) * D;  // qkv row stride (halves)
  const size_t os = (size_t)n_heads * D;                     // out row stride
  const half* qb = qkv + (size_t)h * D;
  const half* kb = qkv + (size_t)(n_heads + kvh) * D;
  const half* vb = qkv + (size_t)(n_heads + n_kv_heads + kvh) * D;
  const uint4 zero4 = make_uint4(0, 0, 0, 0);

  if (q0 >= t_real) {  // padding only
    for (int it = tid; it < (q_end - q0) * CH; it += C::kThreads)
      reinterpret_cast<uint4*>(out + (size_t)(q0 + it / CH) * os + (size_t)h * D)[it % CH] = zero4;
    return;
  }

  // The first query head of the group stores its rows' rotated k and v (k from qkv, rotated here).
  if (h % group == 0) {
    const int* bt = block_table + (size_t)__ldg(slot) * max_blocks;
    const int w_end = min(q_end, t_real);
    for (int it = tid; it < (w_end - q0) * HC; it += C::kThreads) {
      const int t = q0 + it / HC, c = it % HC;
      const uint4* ksrc = reinterpret_cast<const uint4*>(kb + t * rs);
      const uint4* vsrc = reinterpret_cast<const uint4*>(vb + t * rs);
      uint4 x1 = __ldg(ksrc + c), x2 = __ldg(ksrc + c + HC);
      float cs[16];
      rope_cs8(cs, rope_table, inv_freq, table_len, mscale, t, D / 2, 8 * c);
      rope_rotate8(x1, x2, cs);
      const size_t off = cache_offset(bt, t, n_kv_heads, kvh, D);
      uint4* kd = reinterpret_cast<uint4*>(k_cache + off);
      uint4* vd = reinterpret_cast<uint4*>(v_cache + off);
      kd[c] = x1;
      kd[c + HC] = x2;
      vd[c] = __ldg(vsrc + c);
      vd[c + HC] = __ldg(vsrc + c + HC);
    }
  }

  // Rotated queries -> sQ (rows >= t_real zero).
  for (int it = tid; it < BM * HC; it += C::kThreads) {
    const int r = it / HC, c = it % HC, t = q0 + r;
    uint4 x1 = zero4, x2 = zero4;
    if (t < t_real) {
      const uint4* src = reinterpret_cast<const uint4*>(qb + t * rs);
      x1 = __ldg(src + c);
      x2 = __ldg(src + c + HC);
      float cs[16];
      rope_cs8(cs, rope_table, inv_freq, table_len, mscale, t, D / 2, 8 * c);
      rope_rotate8(x1, x2, cs);
    }
    sQ[swz<CH>(r, c)] = x1;
    sQ[swz<CH>(r, c + HC)] = x2;
  }

  const int n_keys = min(q0 + BM, t_real);
  const int n_tiles = (n_keys + BN - 1) / BN;
  const int j0 = window > 0 ? max(0, q0 - window + 1) / BN : 0;  // first tile the block's rows may see

  // K tile prefetch (raw keys in registers; rotated when stored), V via cp.async.
  uint4 kx1[C::kKItems], kx2[C::kKItems];
  auto prefetch = [&](int j) {
#pragma unroll
    for (int i = 0; i < C::kKItems; ++i) {
      const int it = tid + i * C::kThreads, r = it / HC, c = it % HC, t = j * BN + r;
      kx1[i] = zero4;
      kx2[i] = zero4;
      if (t < t_real) {
        const uint4* src = reinterpret_cast<const uint4*>(kb + t * rs);
        kx1[i] = __ldg(src + c);
        kx2[i] = __ldg(src + c + HC);
      }
    }
    uint4* dst = sV + (j & 1) * BN * CH;
    for (int it = tid; it < BN * CH; it += C::kThreads) {
      const int r = it / CH, c = it % CH, t = j * BN + r;
      const bool ok = t < t_real;
      cp_async16(dst + swz<CH>(r, c), ok ? reinterpret_cast<const uint4*>(vb + t * rs) + c
                                          : reinterpret_cast<const uint4*>(vb), ok);
    }
    cp_async_commit();
  };

  prefetch(j0);
  __syncthreads();  // sQ complete
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    ldsm_x4(qf[ks], sQ + swz<CH>(16 * warp + (lane & 15), 2 * ks + (lane >> 4)));

  float o[NO][4];
#pragma unroll
  for (int d = 0; d < NO; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int r0 = q0 + 16 * warp;  // this warp's first query row
  const float sl2 = scale * kLog2e, cap_l2 = softcap * kLog2e, inv_cap = softcap > 0.f ? scale / softcap : 0.f;

  for (int j = j0; j < n_tiles; ++j) {
    uint4* kt = sK + (j & 1) * BN * CH;
    const uint4* vt = sV + (j & 1) * BN * CH;
#pragma unroll
    for (int i = 0; i < C::kKItems; ++i) {
      const int it = tid + i * C::kThreads, r = it / HC, c = it % HC, t = j * BN + r;
      if (t < t_real) {
        float cs[16];
        rope_cs8(cs, rope_table, inv_freq, table_len, mscale, t, D / 2, 8 * c);
        rope_rotate8(kx1[i], kx2[i], cs);
      }
      kt[swz<CH>(r, c)] = kx1[i];
      kt[swz<CH>(r, c + HC)] = kx2[i];
    }
    cp_async_wait<0>();
    __syncthreads();  // tile j of K and V visible; tile j-1 finished by every warp
    if (j + 1 < n_tiles) prefetch(j + 1);

    const int k0 = j * BN;
    if (r0 >= t_real || k0 > r0 + 15) continue;  // padding warp, or tile above this warp's rows
    if (window > 0 && k0 + BN - 1 < r0 - window + 1) continue;  // tile below every row's window

    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, kt + swz<CH>(16 * np + ((lane >> 4) << 3) + (lane & 7), 2 * ks + ((lane >> 3) & 1)));
        mma16816(s[2 * np], qf[ks], b[0], b[1]);
        mma16816(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }
    const bool need_mask = k0 + BN - 1 > r0 || k0 + BN > t_real || (window > 0 && k0 < r0 + 15 - window + 1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * tig + (e & 1), row = r0 + g + 8 * (e >> 1);
        const bool masked = need_mask && (key > row || key >= t_real || (window > 0 && key <= row - window));
        s[nt][e] = masked ? -INFINITY : score_log2(s[nt][e], sl2, softcap, cap_l2, inv_cap);
      }
    }
    online_softmax<NT, NO>(s, m, l, o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                       pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, vt + swz<CH>(16 * kk + (((lane >> 3) & 1) << 3) + (lane & 7), 2 * dp + (lane >> 4)));
        mma16816(o[2 * dp], a, b[0], b[1]);
        mma16816(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }

  // Normalise and store; rows >= t_real (and warps that saw no key) store zeros.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = r0 + g + 8 * r;
    if (row >= L) continue;
    const float inv = (row < t_real && sum > 0.f) ? 1.f / sum : 0.f;
    half* dst = out + (size_t)row * os + (size_t)h * D + 2 * tig;
#pragma unroll
    for (int d = 0; d < NO; ++d)
      *reinterpret_cast<__half2*>(dst + 8 * d) = __floats2half2_rn(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
  }
}

// -- fallback -----------------------------------------------------------------------------------

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.f);
  return is_max ? warp_max(v) : warp_sum(v);
}

// Scores of query q (f32, rotated, already f16-rounded; [D] in smem) against keys lo..lo+n-1
// (key_at / val_at read them), written (times scale, then capped to softcap * tanhf(s / softcap) when
// softcap > 0) to sc[0..n). Then softmax and out = P.V into dst (f16). Shared by both fallbacks.
template <class KeyAt, class ValAt>
__device__ __forceinline__ void attend_ref(const float* sq, float* sc, float* red, int lo, int n, int D,
                                           float scale, float softcap, KeyAt key_at, ValAt val_at, half* dst) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int hd = D / 2;
  for (int s = warp; s < n; s += nw) {
    float dot = 0.f;
    for (int i = lane; i < hd; i += 32) {
      const float2 kr = key_at(lo + s, i);  // rotated (k[i], k[i + D/2]) as f16-rounded floats
      dot += sq[i] * kr.x + sq[i + hd] * kr.y;
    }
    dot = warp_sum(dot);
    if (lane == 0) sc[s] = softcap > 0.f ? softcap * tanhf(dot * scale / softcap) : dot * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n; s += blockDim.x) mx = fmaxf(mx, sc[s]);
  mx = block_reduce(mx, red, true);
  float sum = 0.f;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float e = expf(sc[s] - mx);
    sc[s] = e;
    sum += e;
  }
  sum = block_reduce(sum, red, false);  // its barriers also publish sc
  const float inv = 1.f / sum;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < n; ++s) acc += sc[s] * val_at(lo + s, d);
    dst[d] = __float2half_rn(acc * inv);
  }
}

__device__ __forceinline__ float2 rotate_pair_h(const half* x, int i, int hd, float2 cs) {
  const float2 r = rope_pair(__half2float(x[i]), __half2float(x[i + hd]), cs.x, cs.y);
  return make_float2(__half2float(__float2half_rn(r.x)), __half2float(__float2half_rn(r.y)));
}

__device__ __forceinline__ void attention_prefill_ref(
    half* out, const half* qkv, const float* rope_table, const float* inv_freq, half* k_cache,
    half* v_cache, const int* block_table, const int* slot, const int* n_real, int L, int n_heads,
    int n_kv_heads, int head_dim, int table_len, int max_blocks, int window, float scale, float mscale,
    float softcap) {
  extern __shared__ float smem_ref[];
  const int D = head_dim, hd = D / 2;
  float* sq = smem_ref;       // [D]
  float* sc = sq + D;         // [L]
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int t_real = __ldg(n_real);
  const int group = n_heads / n_kv_heads, kvh = h / group;
  const size_t rs = (size_t)(n_heads + 2 * n_kv_heads) * D;
  half* dst = out + (size_t)t * n_heads * D + (size_t)h * D;
  if (t >= t_real) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = __float2half_rn(0.f);
    return;
  }
  const half* kb = qkv + (size_t)(n_heads + kvh) * D;
  const half* vb = qkv + (size_t)(n_heads + n_kv_heads + kvh) * D;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    const float2 cs = rope_cs(rope_table, inv_freq, table_len, mscale, t, hd, i);
    const float2 q = rotate_pair_h(qkv + t * rs + (size_t)h * D, i, hd, cs);
    sq[i] = q.x;
    sq[i + hd] = q.y;
    if (h % group == 0) {  // this row's k and v into the cache
      const size_t off = cache_offset(block_table + (size_t)__ldg(slot) * max_blocks, t, n_kv_heads, kvh, D);
      const float2 k = rotate_pair_h(kb + t * rs, i, hd, cs);
      k_cache[off + i] = __float2half_rn(k.x);
      k_cache[off + i + hd] = __float2half_rn(k.y);
      v_cache[off + i] = vb[t * rs + i];
      v_cache[off + i + hd] = vb[t * rs + i + hd];
    }
  }
  __syncthreads();
  auto key_at = [&](int s, int i) {
    return rotate_pair_h(kb + s * rs, i, hd, rope_cs(rope_table, inv_freq, table_len, mscale, s, hd, i));
  };
  auto val_at = [&](int s, int d) { return __half2float(vb[s * rs + d]); };
  const int lo = window > 0 ? max(0, t - window + 1) : 0;
  attend_ref(sq, sc, red, lo, t + 1 - lo, D, scale, softcap, key_at, val_at, dst);
}

}  // namespace grokc_attn
