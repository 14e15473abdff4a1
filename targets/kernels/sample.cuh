// sample (artifacts/kernel_abi.py): one token per row of f32 logits, and the slot's state update.
//
// sample_rows<CS>: CS blocks of kThreads threads per row, grid (M * CS, 1, 1).
//   CS = 1: the block reads its row from global memory (it stays in L2) on every pass.
//   CS > 1 (sm_90+, the entry carries __cluster_dims__(CS, 1, 1)): the CS blocks of a row form a
//   thread-block cluster; block r stages tokens [r * S, (r + 1) * S) of the row in dynamic shared
//   memory (S = slice_len(V, CS), S * 4 bytes) once, every pass reads only its slice, and the blocks
//   exchange maxima, histograms and masses through distributed shared memory (cluster.cuh). One row
//   thus spreads over CS multiprocessors instead of one, which is what the passes below need: the
//   row is read five to nine times and a single block moves ~0.1 TB/s.
// Per row, by mode:
//   greedy (temperature <= 0): one pass, argmax with the lowest index on ties.
//   sampling: one pass for max(logits) (max(l) = max(logits) / T since the division is monotone);
//     top-k: an exact radix select of the top_k-th largest logit on order-preserving keys of the
//     float bits (3 passes: 11, 11, 10 bits), divided by T (the division keeps the order);
//     top-p: the same radix walk over the logits' keys among the kept tokens, weighted by p, finds
//     the largest tau whose kept mass sum(p >= tau) reaches top_p times the kept mass (3 passes; p is
//     computed only for elements whose key matches the digits chosen so far);
//     then one pass of per-128-token chunk masses, a scan to the chunk holding u * mass, and one
//     warp's walk inside it (index order).
//   Masses are fixed-point integers (p * 2^46 in u64, exact sums in any order), so every pass and
//   every block split agree; the oracle sums in float64, so both only differ where a boundary falls within
//   ~1e-9 of the mass.
// u = uniform(seed[b], c) is artifacts/rng.py's PCG hash in uint32 arithmetic, bit-identical.
// Needs IEEE division and expf (no --use_fast_math).
#pragma once

#include <stdint.h>

#include "cluster.cuh"

namespace grokc_sample {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;          // radix digits of 11 bits (3 passes: 11, 11, 10)
constexpr int kChunk = 128;             // tokens per chunk of the final walk (32 lanes x 4)
constexpr int kMaxVocab = kMaxBins * kChunk;
constexpr float kFixed = 70368744177664.f;  // 2^46: p in [0, 1] -> u64; V * 2^46 < 2^64

// Tokens per block of a cluster of CS: whole chunks (and 16-byte aligned when the row is).
__host__ __device__ constexpr int slice_len(int V, int CS) {
  return ((V + CS - 1) / CS + kChunk - 1) / kChunk * kChunk;
}

__device__ __forceinline__ uint32_t pcg_hash(uint32_t x) {
  const uint32_t state = x * 747796405u + 2891336453u;
  const uint32_t word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

__device__ __forceinline__ float uniform(uint32_t seed, uint32_t counter) {
  const uint32_t h = pcg_hash(seed ^ pcg_hash(counter));
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

// Float -> uint32 with the same order (ascending); NaN is not expected.
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <int CS>
struct Shared {
  static constexpr int kChunks = kMaxVocab / kChunk / CS;  // chunks of one slice (<= kMaxBins)
  // radix histogram of the slice, then of the row; after the selections the slice's chunk masses,
  // then the mass before each chunk
  unsigned long long hist[kMaxBins];
  unsigned long long part[CS > 1 ? kMaxBins / CS : 1];  // the row's counts of this block's share of the bins
  int chunk_last[kChunks];             // last kept index of each chunk, -1 when none
  unsigned long long warp_tot[kWarps];
  float warp_val[kWarps];
  int warp_idx[kWarps];
  unsigned long long sel_above;
  int sel_bin, first;
  // published to the cluster
  float blk_val;                       // the slice's max logit and its lowest index
  int blk_idx;
  unsigned long long blk_mass;         // the slice's kept mass
  int blk_last;                        // the slice's last kept index, -1 when none
  int blk_found, blk_token;            // the slice holds the target's chunk; what its walk picked
  // the slot's parameters, read once
  int c, top_k;
  float temperature, top_p, u;
};

// `v` of block r of the cluster (this block's own when CS == 1).
template <int CS, class T>
__device__ __forceinline__ T at_rank(T& v, int r) {
  if constexpr (CS == 1) return v;
  else return *grokc_cluster_map(&v, r);
}

// This block's part of the row: n tokens from index base, at x (global memory when CS == 1, the
// staged slice in shared memory otherwise); vec: x is 16-byte aligned and n % 4 == 0 where it counts.
struct Slice {
  const float* x;
  int base, n;
  bool vec;
};

// x[j0 .. j0 + 3] of the slice, -inf past its end.
template <int CS>
__device__ __forceinline__ void load4(const Slice& s, int j0, float (&x)[4]) {
  if (s.vec && j0 + 3 < s.n) {
    const float4* p = reinterpret_cast<const float4*>(s.x + j0);
    float4 v;
    if constexpr (CS == 1) v = __ldg(p);
    else v = *p;
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + e;
      if constexpr (CS == 1) x[e] = j < s.n ? __ldg(s.x + j) : -INFINITY;
      else x[e] = j < s.n ? s.x[j] : -INFINITY;
    }
  }
}

// f(j, x, valid) for every element of the slice (j its index in the row), each thread its share in
// groups of 4; valid is false for the padding of the last group.
template <int CS, class F>
__device__ __forceinline__ void for_slice(const Slice& s, F&& f) {
  const int groups = (s.n + 3) / 4;
#pragma unroll 2
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float x[4];
    load4<CS>(s, 4 * g, x);
#pragma unroll
    for (int e = 0; e < 4; ++e) f(s.base + 4 * g + e, x[e], 4 * g + e < s.n);
  }
}

// *a += w in shared memory as two 32-bit atomics: the low word's add returns the old value, so the
// one add that wraps it knows to carry into the high word; after the block's adds the u64 is the
// exact sum. Shared memory has no native 64-bit atomic add (it would be a compare-and-swap loop,
// which the skewed bins of a radix pass make thousands of threads retry). (Aggregating a warp's adds
// per bin first, by match.any and redux, measured 4x slower than these contended adds on the H200.)
__device__ __forceinline__ void shared_add_u64(unsigned long long* a, unsigned long long w) {
  unsigned* word = reinterpret_cast<unsigned*>(a);  // little-endian: low word first
  const unsigned lo = static_cast<unsigned>(w), hi = static_cast<unsigned>(w >> 32);
  const unsigned old = atomicAdd(word, lo);
  const unsigned high = hi + (old + lo < old ? 1u : 0u);
  if (high != 0u) atomicAdd(word + 1, high);
}

// Inclusive block-wide prefix sum of one u64 per thread; *total gets the block's sum.
template <int CS>
__device__ __forceinline__ unsigned long long block_scan(unsigned long long v, Shared<CS>& sh,
                                                         unsigned long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  __syncthreads();  // warp_tot may still be read by a previous call
  if (lane == 31) sh.warp_tot[warp] = v;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const unsigned long long t = sh.warp_tot[w];
    before += w < warp ? t : 0ull;
    all += t;
  }
  *total = all;
  return before + v;
}

// Bins nb-1 down to 0 (nb = kThreads or 2 * kThreads): pick the highest bin d with
// above + sum(hist[d..]) >= target (target clamped to what the bins hold); on return every thread
// sees sh.sel_bin = d and sh.sel_above = above + sum(hist[d+1..]). *total = sum of the bins.
template <int CS>
__device__ __forceinline__ void find_bin(Shared<CS>& sh, int nb, unsigned long long target,
                                         unsigned long long above, unsigned long long* total) {
  const int per = nb / kThreads;  // 1 or 2
  unsigned long long mine = 0;
  for (int q = 0; q < per; ++q) mine += sh.hist[nb - 1 - (threadIdx.x * per + q)];
  const unsigned long long incl = block_scan(mine, sh, total);
  target = min(target, above + *total);
  unsigned long long run = above + incl - mine;
  for (int q = 0; q < per; ++q) {
    const int bin = nb - 1 - (threadIdx.x * per + q);
    const unsigned long long h = sh.hist[bin];
    if (run < target && run + h >= target) {
      sh.sel_bin = bin;
      sh.sel_above = run;
    }
    run += h;
  }
  __syncthreads();
}

// The largest logit key K (float_key(x)) such that the weight of the members with key >= K reaches
// the target: for weight 1 and target k, the k-th largest logit. member(x, weight) says whether an
// element is a member and gives its weight; it is called only for elements whose key matches the
// digits chosen so far, so the passes after the first cost a compare per element. The members must
// be closed upward (x member, x' > x: x' member) and the weight non-decreasing in x: then for every
// non-decreasing f, f(key_float(K)) is the same selection made on f(x) (order statistics commute with
// f), which is how the callers get the k-th largest x / T and top-p's probability threshold. With
// frac >= 0 the target is ceil(frac * total weight), known after the first pass.
// Each pass, CS > 1: every block counts its slice into hist; after a cluster barrier block r sums
// bins [r * nb / CS, (r + 1) * nb / CS) of every block's hist into its part; after a second barrier
// (no block reads a hist any more) every block gathers all parts into its hist and selects alone.
template <int CS, class Member>
__device__ __forceinline__ uint32_t radix_select(const Slice& sl, Shared<CS>& sh, Member member,
                                                 unsigned long long target, double frac) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass < 2 ? 2048 : 1024;
    for (int i = tid; i < nb; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    for_slice<CS>(sl, [&](int, float x, bool valid) {
      const uint32_t key = float_key(x);
      unsigned long long w;
      if (valid && (key & mask) == prefix && member(x, w) && w != 0)
        shared_add_u64(&sh.hist[(key >> shift) & (nb - 1)], w);
    });
    __syncthreads();
    if constexpr (CS > 1) {
      const int share = nb / CS, first_bin = grokc_cluster_rank() * share;
      grokc_cluster_sync();
      for (int i = tid; i < share; i += kThreads) {
        unsigned long long s = 0;
#pragma unroll
        for (int r = 0; r < CS; ++r) s += at_rank<CS>(sh.hist[first_bin + i], r);
        sh.part[i] = s;
      }
      grokc_cluster_sync();
      for (int i = tid; i < nb; i += kThreads) sh.hist[i] = at_rank<CS>(sh.part[i % share], i / share);
      __syncthreads();
    }
    unsigned long long total;
    if (pass == 0 && frac >= 0.0) {
      // the first pass sees every member: its total is the whole mass
      unsigned long long mine = 0;
      for (int q = 0; q < nb / kThreads; ++q) mine += sh.hist[tid * (nb / kThreads) + q];
      block_scan(mine, sh, &total);
      target = static_cast<unsigned long long>(ceil(frac * static_cast<double>(total)));
      if (target == 0) target = 1;
    }
    find_bin(sh, nb, target, above, &total);
    above = sh.sel_above;
    prefix |= static_cast<uint32_t>(sh.sel_bin) << shift;
    mask |= static_cast<uint32_t>(nb - 1) << shift;
  }
  return prefix;
}

__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

template <int CS>
__device__ __forceinline__ void sample_rows(
    const float* logits, int M, int V, const int* slot, const int* n_real, const float* temperature,
    const int* top_k, const float* top_p, const int* seed, int* tokens, int* positions, int* active,
    int* out_tokens, int* out_count, const int* max_new, const int* eos_ids, int n_eos, int max_out) {
  __shared__ Shared<CS> sh;
  const int i = blockIdx.x / CS, rank = CS > 1 ? grokc_cluster_rank() : 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool prefill = slot != nullptr;
  const int b = prefill ? slot[0] : i;
  if (!prefill && active[b] == 0) return;  // every thread of the cluster takes the same branch
  if (tid == 0) {
    sh.c = prefill ? 0 : out_count[b];
    sh.temperature = temperature[b];
    sh.top_k = top_k[b];
    sh.top_p = top_p[b];
    sh.u = uniform(static_cast<uint32_t>(seed[b]), static_cast<uint32_t>(sh.c));
    sh.first = 0x7fffffff;
    sh.blk_last = -1;
    sh.blk_found = 0;
    sh.blk_token = -1;
  }
  const float* row = logits + (size_t)i * V;
  const bool row_vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  Slice sl{row, 0, V, row_vec};
  if constexpr (CS > 1) {
    extern __shared__ float4 staged[];
    const int S = slice_len(V, CS);
    sl = Slice{reinterpret_cast<const float*>(staged), rank * S, max(0, min(S, V - rank * S)), true};
    if (row_vec) {  // S % 128 == 0: the slice starts 16-byte aligned and n % 4 == 0
      const float4* src = reinterpret_cast<const float4*>(row + sl.base);
      for (int q = tid; q < sl.n / 4; q += kThreads) staged[q] = __ldg(src + q);
    } else {
      float* dst = reinterpret_cast<float*>(staged);
      for (int j = tid; j < sl.n; j += kThreads) dst[j] = __ldg(row + sl.base + j);
    }
  }
  __syncthreads();
  const float T = sh.temperature;

  // Pass 1: max logit and its lowest index, over the slice, then over the cluster.
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for_slice<CS>(sl, [&](int j, float x, bool valid) {
    if (valid) argmax_merge(best, best_i, x, j);
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_merge(best, best_i, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_i, o));
  if (lane == 0) sh.warp_val[warp] = best, sh.warp_idx[warp] = best_i;
  __syncthreads();
  if (tid == 0) {
    float v = sh.warp_val[0];
    int vi = sh.warp_idx[0];
    for (int w = 1; w < kWarps; ++w) argmax_merge(v, vi, sh.warp_val[w], sh.warp_idx[w]);
    sh.blk_val = v, sh.blk_idx = vi;
  }
  __syncthreads();
  if constexpr (CS > 1) grokc_cluster_sync();
  best = -INFINITY;
  best_i = 0x7fffffff;
  for (int r = 0; r < CS; ++r) argmax_merge(best, best_i, at_rank<CS>(sh.blk_val, r), at_rank<CS>(sh.blk_idx, r));

  int token = best_i;
  if (T > 0.f) {
    const float mx = __fdiv_rn(best, T);  // max of logits / T
    const int k = sh.top_k;
    const bool use_k = k > 0 && k < V;
    const float tp = sh.top_p;
    const bool use_p = tp > 0.f && tp < 1.f;

    // The selections run on the logits' keys; x / T and p are non-decreasing in x, so the k-th largest
    // x / T is the k-th largest x divided by T, and top-p's threshold is p of the selected logit.
    float kth = -INFINITY;
    if (use_k) {
      const uint32_t key = radix_select(
          sl, sh,
          [](float, unsigned long long& w) {
            w = 1;
            return true;
          },
          static_cast<unsigned long long>(k), -1.0);
      kth = __fdiv_rn(key_float(key), T);
    }
    auto prob = [&](float x, float& l) {
      l = __fdiv_rn(x, T);
      return expf(__fsub_rn(l, mx));
    };
    float tau = 0.f;
    if (use_p) {
      const uint32_t key = radix_select(
          sl, sh,
          [&](float x, unsigned long long& w) {
            float l;
            const float p = prob(x, l);
            w = static_cast<unsigned long long>(p * kFixed);
            return l >= kth;
          },
          1ull, static_cast<double>(tp));
      float l;
      tau = prob(key_float(key), l);
    }
    auto weight = [&](float x, bool& kept) -> unsigned long long {
      float l;
      const float p = prob(x, l);
      kept = l >= kth && p >= tau;
      return kept ? static_cast<unsigned long long>(p * kFixed) : 0ull;
    };

    // Chunk masses of the slice in index order: warp w takes chunks w, w + 32, ...; lane l tokens 4l..4l+3.
    const int n_chunks = (sl.n + kChunk - 1) / kChunk;
    for (int ch = warp; ch < n_chunks; ch += kWarps) {
      const int j0 = ch * kChunk + 4 * lane;
      float x[4];
      load4<CS>(sl, j0, x);
      unsigned long long s = 0;
      int last = -1;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool kept;
        const unsigned long long w = weight(x[e], kept);
        kept = kept && j0 + e < sl.n;
        s += kept ? w : 0ull;
        if (kept) last = sl.base + j0 + e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
      }
      if (lane == 0) {
        sh.hist[ch] = s, sh.chunk_last[ch] = last;
        atomicMax(&sh.blk_last, last);
      }
    }
    __syncthreads();
    // Exclusive prefix of the slice's chunk masses (thread t: chunks t * per ..).
    const int per = (n_chunks + kThreads - 1) / kThreads;
    unsigned long long mine = 0;
    for (int q = 0; q < per; ++q) {
      const int ch = tid * per + q;
      if (ch < n_chunks) mine += sh.hist[ch];
    }
    unsigned long long slice_mass;
    const unsigned long long incl = block_scan(mine, sh, &slice_mass);
    if (tid == 0) sh.blk_mass = slice_mass;
    __syncthreads();
    if constexpr (CS > 1) grokc_cluster_sync();
    // The mass before this slice, the row's mass and the target u * mass.
    unsigned long long before = 0, total = 0;
    for (int r = 0; r < CS; ++r) {
      const unsigned long long m = at_rank<CS>(sh.blk_mass, r);
      before += r < rank ? m : 0ull;
      total += m;
    }
    const unsigned long long target =
        static_cast<unsigned long long>(ceil(static_cast<double>(sh.u) * static_cast<double>(total)));
    unsigned long long run = before + incl - mine;
    int first = 0x7fffffff;
    for (int q = 0; q < per; ++q) {
      const int ch = tid * per + q;
      if (ch >= n_chunks) break;
      const unsigned long long h = sh.hist[ch];
      sh.hist[ch] = run;  // now the mass before the chunk
      if (first == 0x7fffffff && sh.chunk_last[ch] >= 0 && run + h >= target) first = ch;
      run += h;
    }
    if (first != 0x7fffffff) atomicMin(&sh.first, first);
    __syncthreads();
    const int ch = sh.first;
    if (warp == 0 && ch != 0x7fffffff) {  // walk the chunk: first kept token whose running mass reaches target
      const int j0 = ch * kChunk + 4 * lane;
      float x[4];
      load4<CS>(sl, j0, x);
      unsigned long long w[4], s = 0;
      bool kept[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        w[e] = weight(x[e], kept[e]);
        kept[e] = kept[e] && j0 + e < sl.n;
        s += kept[e] ? w[e] : 0ull;
      }
      unsigned long long incl_l = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(0xffffffffu, incl_l, o);
        if (lane >= o) incl_l += n;
      }
      unsigned long long r = sh.hist[ch] + incl_l - s;
      int hit = -1;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        r += kept[e] ? w[e] : 0ull;
        if (hit < 0 && kept[e] && r >= target) hit = sl.base + j0 + e;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, hit >= 0);
      const int pick = __shfl_sync(0xffffffffu, hit, ballot ? __ffs(ballot) - 1 : 0);
      if (lane == 0) sh.blk_found = 1, sh.blk_token = ballot ? pick : -1;
    }
    __syncthreads();
    if constexpr (CS > 1) grokc_cluster_sync();
    // The first slice holding the target's chunk decides; not reached (cannot happen with u < 1):
    // the row's last kept token.
    token = -1;
    int last = -1;
    bool found = false;
    for (int r = 0; r < CS; ++r) {
      last = max(last, at_rank<CS>(sh.blk_last, r));
      if (!found && at_rank<CS>(sh.blk_found, r)) found = true, token = at_rank<CS>(sh.blk_token, r);
    }
    if (token < 0) token = last;
  }

  if (rank == 0 && tid == 0) {
    const int c = sh.c;
    tokens[b] = token;
    if (c < max_out) out_tokens[(size_t)b * max_out + c] = token;
    out_count[b] = c + 1;
    positions[b] = prefill ? n_real[0] : positions[b] + 1;
    bool stop = c + 1 >= max_new[b];
    for (int e = 0; e < n_eos; ++e) stop = stop || eos_ids[e] == token;
    active[b] = stop ? 0 : 1;
  }
  if constexpr (CS > 1) grokc_cluster_sync();  // keep this block's shared memory until the others have read it
}

}  // namespace grokc_sample
