// sample (artifacts/kernel_abi.py): one token per row of f32 logits, and the slot's state update.
//
// sample_rows<V>: one block of kThreads threads per row (grid (M, 1, 1)), static shared memory only.
// Every pass re-reads the row (it stays in L2); per row, by mode:
//   greedy (temperature <= 0): one pass, argmax with the lowest index on ties.
//   sampling: one pass for max(logits) (max(l) = max(logits) / T since the division is monotone);
//     top-k: an exact radix select of the top_k-th largest logit on order-preserving keys of the
//     float bits (3 passes: 11, 11, 10 bits), divided by T (the division keeps the order);
//     top-p: the same radix walk over the logits' keys among the kept tokens, weighted by p, finds
//     the largest tau whose kept mass sum(p >= tau) reaches top_p times the kept mass (3 passes; p is
//     computed only for elements whose key matches the digits chosen so far);
//     then one pass of per-128-token chunk masses, a block scan to the chunk holding u * mass, and
//     one warp's walk inside it (index order).
//   Masses are fixed-point integers (p * 2^46 in u64, exact sums in any order), so every pass agrees
//   with every other and the result does not depend on the summation order; the oracle sums in
//   float64, so both only differ where a boundary falls within ~1e-9 of the mass.
// u = uniform(seed[b], c) is artifacts/rng.py's PCG hash in uint32 arithmetic, bit-identical.
// Needs IEEE division and expf (no --use_fast_math).
#pragma once

#include <stdint.h>

namespace grokc_sample {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;          // radix digits of 11 bits; also the chunk-mass array
constexpr int kChunk = 128;             // tokens per chunk of the final walk (32 lanes x 4)
constexpr int kMaxVocab = kMaxBins * kChunk;
constexpr float kFixed = 70368744177664.f;  // 2^46: p in [0, 1] -> u64; V * 2^46 < 2^64

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

struct Shared {
  unsigned long long hist[kMaxBins];  // radix histogram, then chunk masses / exclusive prefixes
  int chunk_last[kMaxBins];           // last kept index of each chunk, -1 when none
  unsigned long long warp_tot[kWarps];
  float warp_val[kWarps];
  int warp_idx[kWarps];
  unsigned long long sel_above;
  int sel_bin;
  int token;
  // the slot's parameters, read once
  int b, c, top_k;
  float temperature, top_p, u;
};

// f(j, x) for every element of the row, each thread its share, 16-byte loads where aligned.
template <class F>
__device__ __forceinline__ void for_row(const float* row, int V, F&& f) {
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
    for (int j = threadIdx.x; j < (V >> 2); j += kThreads) {
      const float4 x = __ldg(r4 + j);
      f(4 * j, x.x);
      f(4 * j + 1, x.y);
      f(4 * j + 2, x.z);
      f(4 * j + 3, x.w);
    }
  } else {
    for (int j = threadIdx.x; j < V; j += kThreads) f(j, __ldg(row + j));
  }
}

// *a += w in shared memory as two 32-bit atomics: the low word's add returns the old value, so the
// one add that wraps it knows to carry into the high word; after the block's adds the u64 is the
// exact sum. Shared memory has no native 64-bit atomic add (it would be a compare-and-swap loop,
// which the skewed bins of a radix pass make thousands of threads retry).
__device__ __forceinline__ void shared_add_u64(unsigned long long* a, unsigned long long w) {
  unsigned* word = reinterpret_cast<unsigned*>(a);  // little-endian: low word first
  const unsigned lo = static_cast<unsigned>(w), hi = static_cast<unsigned>(w >> 32);
  const unsigned old = atomicAdd(word, lo);
  const unsigned high = hi + (old + lo < old ? 1u : 0u);
  if (high != 0u) atomicAdd(word + 1, high);
}

// Inclusive block-wide prefix sum of one u64 per thread; *total gets the block's sum.
__device__ __forceinline__ unsigned long long block_scan(unsigned long long v, Shared& sh,
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
__device__ __forceinline__ void find_bin(Shared& sh, int nb, unsigned long long target,
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
template <class Member>
__device__ __forceinline__ uint32_t radix_select(const float* row, int V, Shared& sh, Member member,
                                                 unsigned long long target, double frac) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass < 2 ? 2048 : 1024;
    for (int i = threadIdx.x; i < nb; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    for_row(row, V, [&](int, float x) {
      const uint32_t key = float_key(x);
      unsigned long long w;
      if ((key & mask) == prefix && member(x, w) && w != 0) shared_add_u64(&sh.hist[(key >> shift) & (nb - 1)], w);
    });
    __syncthreads();
    unsigned long long total;
    if (pass == 0 && frac >= 0.0) {
      // the first pass sees every member: its total is the whole mass
      unsigned long long mine = 0;
      for (int q = 0; q < nb / kThreads; ++q) mine += sh.hist[threadIdx.x * (nb / kThreads) + q];
      block_scan(mine, sh, &total);
      target = static_cast<unsigned long long>(ceil(frac * static_cast<double>(total)));
      if (target == 0) target = 1;
    }
    find_bin(sh, nb, target, above, &total);
    const int d = sh.sel_bin;
    above = sh.sel_above;
    prefix |= static_cast<uint32_t>(d) << shift;
    mask |= static_cast<uint32_t>(nb - 1) << shift;
  }
  return prefix;
}

__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

__device__ __forceinline__ void sample_rows(
    const float* logits, int M, int V, const int* slot, const int* n_real, const float* temperature,
    const int* top_k, const float* top_p, const int* seed, int* tokens, int* positions, int* active,
    int* out_tokens, int* out_count, const int* max_new, const int* eos_ids, int n_eos, int max_out) {
  __shared__ Shared sh;
  const int i = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool prefill = slot != nullptr;
  const int b = prefill ? slot[0] : i;
  if (!prefill && active[b] == 0) return;  // every thread of the block takes the same branch
  if (tid == 0) {
    sh.c = prefill ? 0 : out_count[b];
    sh.temperature = temperature[b];
    sh.top_k = top_k[b];
    sh.top_p = top_p[b];
    sh.u = uniform(static_cast<uint32_t>(seed[b]), static_cast<uint32_t>(sh.c));
    sh.token = -1;
  }
  __syncthreads();
  const float* row = logits + (size_t)i * V;
  const float T = sh.temperature;

  // Pass 1: max logit and its lowest index.
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for_row(row, V, [&](int j, float x) { argmax_merge(best, best_i, x, j); });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_merge(best, best_i, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_i, o));
  if (lane == 0) sh.warp_val[warp] = best, sh.warp_idx[warp] = best_i;
  __syncthreads();
  best = sh.warp_val[0];
  best_i = sh.warp_idx[0];
  for (int w = 1; w < kWarps; ++w) argmax_merge(best, best_i, sh.warp_val[w], sh.warp_idx[w]);

  int token;
  if (T <= 0.f) {
    token = best_i;
  } else {
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
          row, V, sh,
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
          row, V, sh,
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

    // Chunk masses in index order: warp w takes chunks w, w + 32, ...; lane l tokens 4l..4l+3.
    const int n_chunks = (V + kChunk - 1) / kChunk;
    const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
    auto load4 = [&](int j0, float (&x)[4]) {
      if (vec && j0 + 3 < V) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(row + j0));
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = j0 + e < V ? __ldg(row + j0 + e) : -INFINITY;
      }
    };
    for (int ch = warp; ch < n_chunks; ch += kWarps) {
      const int j0 = ch * kChunk + 4 * lane;
      float x[4];
      load4(j0, x);
      unsigned long long s = 0;
      int last = -1;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool kept;
        const unsigned long long w = weight(x[e], kept);
        kept = kept && j0 + e < V;
        s += kept ? w : 0ull;
        if (kept) last = j0 + e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
      }
      if (lane == 0) sh.hist[ch] = s, sh.chunk_last[ch] = last;
    }
    __syncthreads();
    // Exclusive prefix of chunk masses (thread t: chunks t*per ..), and the target u * mass.
    const int per = (n_chunks + kThreads - 1) / kThreads;
    unsigned long long mine = 0;
    for (int q = 0; q < per; ++q) {
      const int ch = tid * per + q;
      if (ch < n_chunks) mine += sh.hist[ch];
    }
    unsigned long long total;
    const unsigned long long incl = block_scan(mine, sh, &total);
    const unsigned long long target =
        static_cast<unsigned long long>(ceil(static_cast<double>(sh.u) * static_cast<double>(total)));
    if (tid == 0) sh.sel_bin = 0x7fffffff;
    __syncthreads();
    unsigned long long run = incl - mine;
    int first = 0x7fffffff;
    for (int q = 0; q < per; ++q) {
      const int ch = tid * per + q;
      if (ch >= n_chunks) break;
      const unsigned long long h = sh.hist[ch];
      sh.hist[ch] = run;  // now the mass before the chunk
      if (first == 0x7fffffff && sh.chunk_last[ch] >= 0 && run + h >= target) first = ch;
      run += h;
    }
    if (first != 0x7fffffff) atomicMin(&sh.sel_bin, first);
    __syncthreads();
    const int ch = sh.sel_bin;
    if (warp == 0) {
      int pick = -1;
      if (ch != 0x7fffffff) {  // walk the chunk: first kept token whose running mass reaches target
        const int j0 = ch * kChunk + 4 * lane;
        float x[4];
        load4(j0, x);
        unsigned long long w[4], s = 0;
        bool kept[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          w[e] = weight(x[e], kept[e]);
          kept[e] = kept[e] && j0 + e < V;
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
          if (hit < 0 && kept[e] && r >= target) hit = j0 + e;
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, hit >= 0);
        if (ballot) pick = __shfl_sync(0xffffffffu, hit, __ffs(ballot) - 1);
      }
      if (pick < 0) {  // not reached (cannot happen with u < 1): the last kept token
        int last = -1;
        for (int c2 = lane; c2 < n_chunks; c2 += 32) last = max(last, sh.chunk_last[c2]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
        pick = last;
      }
      if (lane == 0) sh.token = pick;
    }
    __syncthreads();
    token = sh.token;
  }

  if (tid == 0) {
    const int c = sh.c;
    tokens[b] = token;
    if (c < max_out) out_tokens[(size_t)b * max_out + c] = token;
    out_count[b] = c + 1;
    positions[b] = prefill ? n_real[0] : positions[b] + 1;
    bool stop = c + 1 >= max_new[b];
    for (int e = 0; e < n_eos; ++e) stop = stop || eos_ids[e] == token;
    active[b] = stop ? 0 : 1;
  }
}

}  // namespace grokc_sample
