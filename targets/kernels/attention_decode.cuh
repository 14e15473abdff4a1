// attention_decode (artifacts/kernel_abi.py): one new token per slot over the paged KV cache.
//
// attention_decode_mma<D, W, ST, CS>: split-K flash decoding on tensor cores, combined in-launch.
//   grid (n_kv_heads * CS, B), block 32 * W, dynamic smem DecodeMma<...>::kSmem; with CS > 1 the
//   kernel carries __cluster_dims__(CS, 1, 1) (sm_90+): the CS blocks of one (slot, kv head) form a
//   cluster. Every block rotates q (all query heads of the kv group, padded to the 16 rows of an
//   m16n8k16 tile) and the new k at position p from qkv; cluster rank 0 writes k and v at p into
//   the cache. The KV blocks 0..p/16 of the slot are split evenly over the CS * W warps; each warp
//   streams its 16-token cache blocks with a cp.async ring of ST stages (zero-filled past p) and
//   runs flash attention on them; row p % 16 of the last block is taken from the block's own rotated
//   k / v in shared memory, never from the cache, so the launch reads nothing it writes.
//   Partials (max, sum, acc) are merged over the warps in shared memory and over the cluster through
//   distributed shared memory (grokc_cluster_map) before one rank-slice of each writes out.
//   No global scratch is needed.
//   EARLY (the launch has a programmatic edge from the qkv GEMV, sm_90+): positions, active, the
//   block table and the first ST - 1 cache blocks of every warp are read before griddepcontrol.wait
//   (earlier replays wrote them), qkv only after it, then the next launch may start. Otherwise the
//   entry waits (kernels/pdl.cuh) and the cache loads follow the qkv reads, which then meet no queue.
//
// attention_decode_ref: fallback for any even head_dim and group size: grid (n_heads, B), block
//   128, smem (max_blocks * 16 + head_dim) * 4 bytes.
//
// window > 0 (a local layer): the new token sees positions max(0, p - window + 1)..p only; both
//   kernels read only the cache blocks that hold them.
// softcap > 0 (Grok-1): both kernels cap the scaled scores, softcap * tanhf(s / softcap) (score_log2).
#pragma once

#include "attention_common.cuh"
#include "attention_prefill.cuh"  // attend_ref, rotate_pair_h
#include "cluster.cuh"
#include "pdl.cuh"

namespace grokc_attn {

template <int D, int W, int ST, int CS>
struct DecodeMma {
  static constexpr int kThreads = 32 * W;
  static constexpr int kCH = D / 8;
  static constexpr int kHC = kCH / 2;
  static constexpr int kStageU4 = 2 * kKvBlock * kCH;   // K and V of one cache block, 16-byte units
  static constexpr int kCombFloats = 32 + 16 * D;       // m[16], l[16], acc[16][D]
  static constexpr int kSmem = (16 * kCH + 2 * kCH + W * ST * kStageU4) * 16 + kCombFloats * 4;
  static_assert(D % 16 == 0 && D <= 128, "head_dim must be 16..128 in steps of 16");
  static_assert(ST >= 2, "a warp's partial reuses its stage ring: need two stages at least");
  static_assert(CS == 1 || CS == 2 || CS == 4 || CS == 8, "portable cluster sizes only");
};

template <int D, int W, int ST, int CS, bool EARLY>
__device__ __forceinline__ void attention_decode_mma(
    half* out, const half* qkv, const float* rope_table, const float* inv_freq, half* k_cache,
    half* v_cache, const int* block_table, const int* positions, const int* active, int B, int n_heads,
    int n_kv_heads, int head_dim, int table_len, int max_blocks, int window, float scale, float mscale,
    float softcap) {
  using C = DecodeMma<D, W, ST, CS>;
  constexpr int CH = C::kCH, HC = C::kHC, NO = D / 8, SU = C::kStageU4, T = C::kThreads;
  extern __shared__ uint4 smem_decode[];
  uint4* sQ = smem_decode;                      // [16][CH] swizzled, rows >= group zero
  uint4* sKn = sQ + 16 * CH;                    // [CH] rotated new k
  uint4* sVn = sKn + CH;                        // [CH] new v
  uint4* stages = sVn + CH;                     // [W][ST][K, V][16][CH] swizzled
  float* comb = reinterpret_cast<float*>(stages + W * ST * SU);  // this block's partial

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int b = blockIdx.y, kvh = blockIdx.x / CS, rank = CS > 1 ? grokc_cluster_rank() : 0;
  const int group = n_heads / n_kv_heads;
  half* orow = out + (size_t)b * n_heads * D + (size_t)kvh * group * D;  // [group * D]
  const int p = __ldg(positions + b);
  // Inactive (or an impossible position): zero row, cache untouched. Same for every block of a cluster.
  if (__ldg(active + b) == 0 || p < 0 || p >= max_blocks * kKvBlock) {
    grokc_pdl_wait();  // out may still be read by an earlier launch (EARLY: nothing waited yet)
    if (rank == 0)
      for (int i = tid; i < group * D; i += T) orow[i] = __float2half_rn(0.f);
    return;
  }

  // This warp's share of the cache blocks 0..nkb-1, and the first ST - 1 of them into its ring.
  // Before the wait: positions, active, the block table and the cache below p were written by
  // earlier replays (only the last launch of a step, sampling, writes positions and active), so
  // this overlaps the launch before (the qkv GEMV) when the edge is programmatic.
  const int* bt = block_table + (size_t)b * max_blocks;
  const int lo = window > 0 ? max(0, p - window + 1) : 0;  // first position the token sees
  const int nkb = p / kKvBlock + 1, kbl = lo / kKvBlock, tw = CS * W, gw = rank * W + warp;
  const int kb0 = kbl + (int)((long long)gw * (nkb - kbl) / tw), kb1 = kbl + (int)((long long)(gw + 1) * (nkb - kbl) / tw);
  uint4* ring = stages + warp * ST * SU;
  auto load = [&](int kbi, int s) {
    uint4* st = ring + s * SU;
    const size_t base = ((size_t)__ldg(bt + kbi) * n_kv_heads + kvh) * kKvBlock * D;
    const uint4* ks = reinterpret_cast<const uint4*>(k_cache + base);
    const uint4* vs = reinterpret_cast<const uint4*>(v_cache + base);
    const int valid = kbi == nkb - 1 ? (p % kKvBlock) : kKvBlock;  // rows read from the cache
#pragma unroll
    for (int i = 0; i < kKvBlock * CH / 32; ++i) {
      const int idx = lane + 32 * i, r = idx / CH, c = idx % CH;
      const bool ok = r < valid;
      cp_async16(st + swz<CH>(r, c), ks + (ok ? idx : 0), ok);
      cp_async16(st + kKvBlock * CH + swz<CH>(r, c), vs + (ok ? idx : 0), ok);
    }
  };
  auto fill_ring = [&] {
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) {
      if (kb0 + i < kb1) load(kb0 + i, i);
      cp_async_commit();
    }
  };
  if constexpr (EARLY) {
    fill_ring();
    grokc_pdl_wait();  // qkv is complete from here on, and nobody reads out any more
    grokc_pdl_launch_dependents();
  }

  // Rotated q of the group's heads, rotated new k, new v -> shared memory.
  const size_t rs = (size_t)(n_heads + 2 * n_kv_heads) * D;
  const half* row = qkv + (size_t)b * rs;
  const int n_rot = (group + 1) * HC;
  for (int it = tid; it < n_rot + CH; it += T) {
    if (it < n_rot) {
      const int hh = it / HC, c = it % HC;
      const int head = hh < group ? kvh * group + hh : n_heads + kvh;
      const uint4* src = reinterpret_cast<const uint4*>(row + (size_t)head * D);
      uint4 x1 = __ldg(src + c), x2 = __ldg(src + c + HC);
      float cs[16];
      rope_cs8(cs, rope_table, inv_freq, table_len, mscale, p, D / 2, 8 * c);
      rope_rotate8(x1, x2, cs);
      if (hh < group) {
        sQ[swz<CH>(hh, c)] = x1;
        sQ[swz<CH>(hh, c + HC)] = x2;
      } else {
        sKn[c] = x1;
        sKn[c + HC] = x2;
      }
    } else {
      const int c = it - n_rot;
      sVn[c] = __ldg(reinterpret_cast<const uint4*>(row + (size_t)(n_heads + n_kv_heads + kvh) * D) + c);
    }
  }
  for (int it = tid; it < (16 - group) * CH; it += T) sQ[group * CH + it] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  GROKC_TRACE_MARK(0);

  if (rank == 0 && tid < 2 * CH) {  // the new token into the cache; nobody in this launch reads it there
    const size_t off = cache_offset(bt, p, n_kv_heads, kvh, D);
    if (tid < CH)
      reinterpret_cast<uint4*>(k_cache + off)[tid] = sKn[tid];
    else
      reinterpret_cast<uint4*>(v_cache + off)[tid - CH] = sVn[tid - CH];
  }
  if constexpr (!EARLY) fill_ring();

  uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) ldsm_x4(qf[ks], sQ + swz<CH>(lane & 15, 2 * ks + (lane >> 4)));
  float o[NO][4];
#pragma unroll
  for (int d = 0; d < NO; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl2 = scale * kLog2e, cap_l2 = softcap * kLog2e, inv_cap = softcap > 0.f ? scale / softcap : 0.f;

  for (int kbi = kb0; kbi < kb1; ++kbi) {
    const int s = (kbi - kb0) % ST;
    cp_async_wait<ST - 2>();
    __syncwarp();
    uint4* kt = ring + s * SU;
    uint4* vt = kt + kKvBlock * CH;
    const bool last = kbi == nkb - 1;
    if (last) {  // row p % 16: the token being decoded, from shared memory
      const int r = p % kKvBlock;
      if (lane < CH)
        kt[swz<CH>(r, lane)] = sKn[lane];
      else if (lane < 2 * CH)
        vt[swz<CH>(r, lane - CH)] = sVn[lane - CH];
      __syncwarp();
    }
    {
      const int nx = kbi + ST - 1;  // refills the stage the previous iteration used
      if (nx < kb1) load(nx, (nx - kb0) % ST);
      cp_async_commit();
    }

    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t bk[4];
      ldsm_x4(bk, kt + swz<CH>(((lane >> 4) << 3) + (lane & 7), 2 * ks + ((lane >> 3) & 1)));
      mma16816(sc[0], qf[ks], bk[0], bk[1]);
      mma16816(sc[1], qf[ks], bk[2], bk[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kbi * kKvBlock + nt * 8 + 2 * tig + (e & 1);
        sc[nt][e] = ((last && key > p) || key < lo) ? -INFINITY : score_log2(sc[nt][e], sl2, softcap, cap_l2, inv_cap);
      }
    }
    online_softmax<2, NO>(sc, m, l, o);
    const uint32_t a[4] = {pack_half2(sc[0][0], sc[0][1]), pack_half2(sc[0][2], sc[0][3]),
                           pack_half2(sc[1][0], sc[1][1]), pack_half2(sc[1][2], sc[1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bv[4];
      ldsm_x4_trans(bv, vt + swz<CH>((((lane >> 3) & 1) << 3) + (lane & 7), 2 * dp + (lane >> 4)));
      mma16816(o[2 * dp], a, bv[0], bv[1]);
      mma16816(o[2 * dp + 1], a, bv[2], bv[3]);
    }
  }
  cp_async_wait<0>();
  __syncwarp();
  GROKC_TRACE_MARK(1);

  // The warp's partial into its own ring: m[16], l[16], acc[16][D] (log2-domain max).
  float* wp = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int qr = g + 8 * r;
    if (tig == 0) {
      wp[qr] = m[r];
      wp[16 + qr] = sum;
    }
#pragma unroll
    for (int d = 0; d < NO; ++d)
      *reinterpret_cast<float2*>(wp + 32 + qr * D + 8 * d + 2 * tig) = make_float2(o[d][2 * r], o[d][2 * r + 1]);
  }
  __syncthreads();
  GROKC_TRACE_MARK(2);

  // Merge the W warps (and, with CS == 1, finish).
  const int n_items = group * D;
  const int wstride = ST * SU * 4;  // floats between two warps' partials
  const float* w0 = reinterpret_cast<const float*>(stages);
  for (int it = tid; it < n_items; it += T) {
    const int gg = it / D, d = it % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, w0[w * wstride + gg]);
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float* pw = w0 + w * wstride;
      const float f = pw[gg] == -INFINITY ? 0.f : exp2f(pw[gg] - mx);
      acc += f * pw[32 + gg * D + d];
      sum += f * pw[16 + gg];
    }
    if constexpr (CS == 1) {
      orow[it] = __float2half_rn(sum > 0.f ? acc / sum : 0.f);
    } else {
      comb[32 + it] = acc;
      if (d == 0) {
        comb[gg] = mx;
        comb[16 + gg] = sum;
      }
    }
  }
  if constexpr (CS > 1) {
    grokc_cluster_sync();  // every block's partial is in its comb
    const int per = (n_items + CS - 1) / CS;
    const int hi = min(n_items, (rank + 1) * per);
    for (int it = rank * per + tid; it < hi; it += T) {
      const int gg = it / D;
      float mr[CS], mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < CS; ++r) {
        mr[r] = *grokc_cluster_map(comb + gg, r);
        mx = fmaxf(mx, mr[r]);
      }
      float acc = 0.f, sum = 0.f;
#pragma unroll
      for (int r = 0; r < CS; ++r) {
        const float f = mr[r] == -INFINITY ? 0.f : exp2f(mr[r] - mx);
        acc += f * *grokc_cluster_map(comb + 32 + it, r);
        sum += f * *grokc_cluster_map(comb + 16 + gg, r);
      }
      orow[it] = __float2half_rn(sum > 0.f ? acc / sum : 0.f);
    }
    grokc_cluster_sync();  // keep this block's shared memory alive until the others have read it
  }
}

// -- fallback -----------------------------------------------------------------------------------

__device__ __forceinline__ void attention_decode_ref(
    half* out, const half* qkv, const float* rope_table, const float* inv_freq, half* k_cache,
    half* v_cache, const int* block_table, const int* positions, const int* active, int B, int n_heads,
    int n_kv_heads, int head_dim, int table_len, int max_blocks, int window, float scale, float mscale,
    float softcap) {
  extern __shared__ float smem_decode_ref[];
  const int D = head_dim, hd = D / 2;
  float* sq = smem_decode_ref;  // [D]
  float* sc = sq + D;           // [max_blocks * 16]
  __shared__ float red[32];
  const int h = blockIdx.x, b = blockIdx.y;
  half* dst = out + (size_t)b * n_heads * D + (size_t)h * D;
  const int p = __ldg(positions + b);
  if (__ldg(active + b) == 0 || p < 0 || p >= max_blocks * kKvBlock) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = __float2half_rn(0.f);
    return;
  }
  const int group = n_heads / n_kv_heads, kvh = h / group;
  const size_t rs = (size_t)(n_heads + 2 * n_kv_heads) * D;
  const half* row = qkv + (size_t)b * rs;
  const half* kn = row + (size_t)(n_heads + kvh) * D;
  const half* vn = row + (size_t)(n_heads + n_kv_heads + kvh) * D;
  const int* bt = block_table + (size_t)b * max_blocks;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    const float2 cs = rope_cs(rope_table, inv_freq, table_len, mscale, p, hd, i);
    const float2 q = rotate_pair_h(row + (size_t)h * D, i, hd, cs);
    sq[i] = q.x;
    sq[i + hd] = q.y;
    if (h % group == 0) {  // the new token into the cache; other blocks read only positions < p
      const size_t off = cache_offset(bt, p, n_kv_heads, kvh, D);
      const float2 k = rotate_pair_h(kn, i, hd, cs);
      k_cache[off + i] = __float2half_rn(k.x);
      k_cache[off + i + hd] = __float2half_rn(k.y);
      v_cache[off + i] = vn[i];
      v_cache[off + i + hd] = vn[i + hd];
    }
  }
  __syncthreads();
  auto key_at = [&](int s, int i) {
    if (s == p) return rotate_pair_h(kn, i, hd, rope_cs(rope_table, inv_freq, table_len, mscale, p, hd, i));
    const half* k = k_cache + cache_offset(bt, s, n_kv_heads, kvh, D);
    return make_float2(__half2float(k[i]), __half2float(k[i + hd]));
  };
  auto val_at = [&](int s, int d) {
    return __half2float(s == p ? vn[d] : v_cache[cache_offset(bt, s, n_kv_heads, kvh, D) + d]);
  };
  const int lo = window > 0 ? max(0, p - window + 1) : 0;
  attend_ref(sq, sc, red, lo, p + 1 - lo, D, scale, softcap, key_at, val_at, dst);
}

}  // namespace grokc_attn
