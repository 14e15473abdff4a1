// `mlp_decode` (kernel_abi): a batch-1 SwiGLU MLP in one launch, with no dependency between its
// gate_up and down halves. Block b owns intermediate outputs [64 b, 64 b + 64): it computes their
// activations from its 64 gate and 64 up rows, multiplies them by its 64 columns of W_down and adds
// the H partial sums into the f32 accumulator `acc` with vector reductions (block 0 adds x, the
// residual, too). Nothing waits for the whole grid: the launch after reads `acc` once this
// grid is complete (griddepcontrol.wait). Every weight byte of a block (gate/up rows by bulk copies,
// the down columns by cp.async) is requested at entry, before griddepcontrol.wait, so the stream
// runs while the launch before finishes (bench/mlp_probe.py; docs/perf-notes.md run 82).
//
// Reads the weights in their stored layouts (artifacts/int4.py, q4 per output channel): the block's
// gate rows and up rows are contiguous, 16 rows per bulk copy; its down columns are 32 bytes of
// each row. Shared memory holds rows as stored, so lane (g, t) of a row group reads row g at step
// (s + g) mod S: the eight rows of a quarter warp fall on different banks, and column g of B
// holds x at that same step, so the useful sums sit on the MMA's diagonal (C[g][g], C[g + 8][g]).
//
// Requirements (targets/rules_mlp.py checks them): sm_90, H % 256 == 0, H <= 2048, I % 64 == 0,
// q4 per output channel; 512 threads; MLP_DECODE_SMEM(H) bytes of dynamic shared memory.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"
#include "linear_common.cuh"
#include "linear_gemv2.cuh"  // q4_pairs, mma_16816
#include "pdl.cuh"

#define MLP_DECODE_SMEM(H) (102 * (H) + 3368)

namespace grokc {
namespace mlp {

using gemv2::q4_pairs;

constexpr int kWarps = 16, kThreads = 32 * kWarps, kUnits = 64, kRowGroups = kUnits / 8;
constexpr int kSplit = kWarps / kRowGroups;  // warps per row group (splitting its steps)

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bulk_rows(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void bar_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ok = 0;
  while (!ok)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void red_add4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  __trap();
#endif
}

// Position of 16-byte piece p (8 halves of x, p = 16 step + 4 t + v) in the staged x: its bits 0
// and 1 flipped by the step's parity and t's high bit, so the eight lanes of a quarter warp
// (steps s, s + 1; t = 0..3; one v) read eight different bank groups.
__device__ __forceinline__ int x_slot(int p) { return p ^ (((p >> 3) & 1) << 1) ^ ((p >> 4) & 1); }

// The down columns: 16 bytes from global, with an L2 prefetch of the 256 bytes around them (the
// neighbouring blocks' columns of the same row, which they ask for at about the same time).
__device__ __forceinline__ void cp_async16_l2(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// ABL (timing ablations for bench/plan_variants.py, symbol mlp_decode_q4_a<ABL>; 0 in artifacts):
// bit 0 the down columns are not loaded, bit 1 no MMAs, bit 2 the down columns without the L2 prefetch,
// bit 3 each block first pulls a contiguous 1 / grid of the down weight into L2 (bulk prefetch),
// bit 4 the down columns are requested after griddepcontrol.wait instead of at entry, bit 5 the down
// "columns" are 32 H contiguous bytes of the down weight (a packed layout's traffic; values wrong),
// bit 6 gate/up given as bench/mlp_probe.py's fragment-order tiles (8 per block, 16512 bytes each) and
// read by the probe's loop; with bit 5, down given as the probe's packed slices ([rg][lane][kb] words):
// ABL 96 is the probe's layouts under this kernel's semantics (bench/mlp_probe.py --grokc),
// bit 7 every weight request after griddepcontrol.wait (none while the launch before runs).
template <int ABL = 0>
__device__ __forceinline__ void mlp_decode(float* acc, float* clear, const __half* x, const __half* norm,
                                           const uint8_t* gate_up, const __half* gu_scales, const __half* gu_zeros,
                                           const uint8_t* down, const __half* dn_scales, const __half* dn_zeros,
                                           int H, int I, float eps) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int row_bytes = H / 2, steps = H / 128;
  uint8_t* gu_s = smem;                                                  // [128 rows][H / 2]: gate 0..63, up 0..63
  uint8_t* dn_s = gu_s + 64 * H + 1024;                                  // [H rows][32 B]: this block's columns
  uint4* xs = reinterpret_cast<uint4*>(dn_s + 32 * H);                   // [H / 8] pieces of x * norm, x_slot order
  __half* dsc = reinterpret_cast<__half*>(xs + H / 8);                   // [H] down scales
  __half* dzs = dsc + H;                                                 // [H] down zeros (when there are)
  float* gsc = reinterpret_cast<float*>(dzs + H);                        // [128] gate/up row scales
  float* gzd = gsc + 2 * kUnits;                                         // [128] (zero - 8), or 0
  float* part = gzd + 2 * kUnits;                                        // [kWarps][16] diagonal sums
  float* sums = part + kWarps * 16;                                      // [32]: warps' sums of squares, of x
  __half* act = reinterpret_cast<__half*>(sums + 32);                    // [64] activations
  uint64_t* bars = reinterpret_cast<uint64_t*>(act + kUnits);            // [5]: gate/up rows 16 c .. 16 c + 15; ABL 32
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, b = blockIdx.x;
  const uint32_t chunk = 16u * row_bytes;

  if (tid == 0) {
    for (int c = 0; c < 5; ++c)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + c)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  auto load_gate_up = [&]() {  // every gate/up byte of the block: nothing here depends on the launch before
    if (tid != 0) return;
    for (int c = 0; c < 4; ++c) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bars + c)), "r"(2 * chunk)
                   : "memory");
      if (ABL & 64) {  // tiles 2c and 2c + 1 (with their 128-byte tails) on barrier c
        asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bars + c)), "r"(256u)
                     : "memory");
        for (int i = 2 * c; i < 2 * c + 2; ++i)
          bulk_rows(gu_s + i * (chunk + 128), gate_up + ((size_t)b * 8 + i) * (chunk + 128), chunk + 128, bars + c);
        continue;
      }
      bulk_rows(gu_s + c * chunk, gate_up + ((size_t)kUnits * b + 16 * c) * row_bytes, chunk, bars + c);
      bulk_rows(gu_s + 4 * chunk + c * chunk, gate_up + ((size_t)I + kUnits * b + 16 * c) * row_bytes, chunk, bars + c);
    }
  };
  if (!(ABL & 128)) load_gate_up();
  if ((ABL & 8) && tid == 0) {  // rows [r0, r1) of the down weight, contiguous, into L2
    const int per = (H + gridDim.x - 1) / gridDim.x, r0 = min(H, per * b), r1 = min(H, r0 + per);
    if (r1 > r0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(down + (size_t)r0 * (I / 2)),
                   "r"((uint32_t)((r1 - r0) * (I / 2))) : "memory");
  }
  // the down columns (32 bytes of each row) and the scales, by cp.async
  auto load_down = [&]() {
    if (ABL & 32) {  // 4 bulk copies of 8 H contiguous bytes, on barrier 3 (waited on before down)
      if (tid == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bars + 4)),
                     "r"(32u * H) : "memory");
        for (int c = 0; c < 4; ++c)
          bulk_rows(dn_s + c * 8 * H, down + (size_t)b * 32 * H + c * 8 * H, 8u * H, bars + 4);
      }
      return;
    }
    for (int i = tid; i < 2 * H && !(ABL & 1); i += kThreads) {
      const uint8_t* src = down + (size_t)(i >> 1) * (I / 2) + 32 * b + 16 * (i & 1);
      if (ABL & 4) cp_async16(dn_s + 16 * i, src, true);
      else cp_async16_l2(dn_s + 16 * i, src);
    }
  };
  if (!(ABL & 144)) load_down();
  for (int i = tid; i < H / 8; i += kThreads) {
    cp_async16(dsc + 8 * i, dn_scales + 8 * i, true);
    if (dn_zeros != nullptr) cp_async16(dzs + 8 * i, dn_zeros + 8 * i, true);
  }
  cp_async_commit();
  if (tid < 2 * kUnits) {
    const int row = tid < kUnits ? kUnits * b + tid : I + kUnits * b + tid - kUnits;
    gsc[tid] = __half2float(gu_scales[row]);
    gzd[tid] = gu_zeros != nullptr ? __half2float(gu_zeros[row]) - 8.f : 0.f;
  }
  grokc_pdl_launch_dependents();
  grokc_pdl_wait();  // x comes from the launch before; acc and clear are free from here on
  if (ABL & 128) load_gate_up();
  if (ABL & 144) {
    load_down();
    cp_async_commit();
  }
  for (int i = b * kThreads + tid; i < H; i += gridDim.x * kThreads) clear[i] = 0.f;

  // x * norm as f16 pieces; the sums of squares of x and of the staged values (for zero points)
  float sq = 0.f, sx = 0.f;
  for (int p = tid; p < H / 8; p += kThreads) {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(x) + p), nv = __ldg(reinterpret_cast<const uint4*>(norm) + p);
    const uint32_t* hv = reinterpret_cast<const uint32_t*>(&v);
    const uint32_t* hn = reinterpret_cast<const uint32_t*>(&nv);
    uint4 o;
    uint32_t* ho = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(u32_as_h2(hv[e]));
      sq += f.x * f.x + f.y * f.y;
      ho[e] = h2_as_u32(__hmul2(u32_as_h2(hv[e]), u32_as_h2(hn[e])));
      const float2 fs = __half22float2(u32_as_h2(ho[e]));
      sx += fs.x + fs.y;
    }
    xs[x_slot(p)] = o;
  }
  sq = warp_sum(sq);
  sx = warp_sum(sx);
  if (lane == 0) sums[w] = sq, sums[kWarps + w] = sx;
  __syncthreads();
  float ssq = 0.f, sxn = 0.f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) ssq += sums[i], sxn += sums[kWarps + i];
  const float rms = rsqrtf(ssq / H + eps);

  if (ABL & 64) {  // the probe's loop: warp w takes half the k blocks of tile w / 2
    const int tw = w >> 1;
    bar_wait(bars + tw / 2);
    const uint8_t* tile = gu_s + tw * (chunk + 128);
    float c[8][4] = {};
    const int q0 = (w & 1) * steps;  // a tile is H / 64 words of 4 k blocks a lane: half of them a warp
    for (int q2 = q0; q2 < q0 + steps; q2 += 2) {  // steps is even: two words a turn, eight accumulators
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int q = q2 + hh;
        const uint4 wd = *reinterpret_cast<const uint4*>(tile + 16 * (q * 32 + lane));
        const uint32_t words[4] = {wd.x, wd.y, wd.z, wd.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int kb = 4 * q + j;  // x (2t, 2t + 1) of pieces 2 kb and 2 kb + 1
          const uint32_t bb[2] = {reinterpret_cast<const uint32_t*>(xs + x_slot(2 * kb))[t],
                                  reinterpret_cast<const uint32_t*>(xs + x_slot(2 * kb + 1))[t]};
          uint32_t a[4];
          q4_pairs(words[j], a);
          mma_16816(c[j + 4 * hh], a, bb);
        }
      }
    }
    float gt = 0.f, up = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) gt += c[i][0], up += c[i][2];
    const int slot = tw + kRowGroups * (w & 1);  // as the row-major path's warps j, j + 8
    if (t == 0) part[16 * slot + g] = gt, part[16 * slot + 8 + g] = up;
  } else {
  // gate_up: warp w takes row group j = w % 8 (gate rows 8 j + g, up rows 8 j + g), every kSplit-th step
    const int j = w % kRowGroups, lo = 8 * j + g, hi = kUnits + 8 * j + g;
    bar_wait(bars + j / 2);
    float c[2][4] = {};
    // Per lane, once: the step sequence (s + g) mod steps for s = w / 8, + kSplit, ... keeps the
    // parity of its first step (steps and kSplit are even), so x_slot's flip of pieces 16 st + 4 t + v
    // is the same for every step: v ^ flip.
    int st = w / kRowGroups + g;
    while (st >= steps) st -= steps;
    const int flip = (((t >> 1) & 1) << 1) | (st & 1);
    const uint8_t* wlo_p = gu_s + lo * row_bytes + 16 * t;
    const uint8_t* whi_p = gu_s + hi * row_bytes + 16 * t;
    const uint4* xs_t = xs + 4 * t;
    for (int s = w / kRowGroups; s < steps; s += kSplit) {
      const uint4 wl = *reinterpret_cast<const uint4*>(wlo_p + 64 * st);
      const uint4 wh = *reinterpret_cast<const uint4*>(whi_p + 64 * st);
      const uint32_t wlo[4] = {wl.x, wl.y, wl.z, wl.w}, whi[4] = {wh.x, wh.y, wh.z, wh.w};
      const uint4* xs_st = xs_t + 16 * st;
      st += kSplit;
      if (st >= steps) st -= steps;
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const uint4 xv = xs_st[v ^ flip];
        uint32_t pl[4], ph[4];
        q4_pairs(wlo[v], pl);
        q4_pairs(whi[v], ph);
        const uint32_t a0[4] = {pl[0], ph[0], pl[1], ph[1]}, b0[2] = {xv.x, xv.y};
        const uint32_t a1[4] = {pl[2], ph[2], pl[3], ph[3]}, b1[2] = {xv.z, xv.w};
        if (!(ABL & 2)) {
          mma_16816(c[0], a0, b0);
          mma_16816(c[1], a1, b1);
        } else {
          c[0][0] += __uint_as_float((a0[0] ^ a0[1] ^ a1[2] ^ a1[3] ^ b0[0] ^ b1[1]) & 0x3fffffffu);
        }
      }
    }
    if (t == (g >> 1)) {  // the diagonal: C[g][g] and C[g + 8][g]
      const bool odd = g & 1;
      part[16 * w + g] = odd ? c[0][1] + c[1][1] : c[0][0] + c[1][0];
      part[16 * w + 8 + g] = odd ? c[0][3] + c[1][3] : c[0][2] + c[1][2];
    }
  }
  __syncthreads();
  if (tid < kUnits) {  // output 8 j + gg of the block, and the sum of the activations (zero points)
    const int j = tid >> 3, gg = tid & 7;
    float gt = 0.f, up = 0.f;
    for (int k = 0; k < kSplit; ++k) gt += part[16 * (j + kRowGroups * k) + gg], up += part[16 * (j + kRowGroups * k) + 8 + gg];
    gt = (gt - gzd[tid] * sxn) * gsc[tid] * rms;
    up = (up - gzd[kUnits + tid] * sxn) * gsc[kUnits + tid] * rms;
    act[tid] = __float2half_rn(silu(gt) * up);
    const float a = warp_sum(__half2float(act[tid]));
    if (lane == 0) sums[tid >> 5] = a;  // warps 0 and 1: their sums of squares were read above
  }
  cp_async_wait<0>();
  if (ABL & 32) bar_wait(bars + 4);
  __syncthreads();

  // down: warp w takes row groups w, w + 16, ... of H / 16; lane (g, t) reads words 2t, 2t + 1 of
  // rows 16 rg + g and + 8 (codes 16 t .. 16 t + 15 of the block's 64), B the matching activations
  {
    // pieces 2t and 2t + 1 of the activations (8 halves each): B of word 0 and word 1
    const uint4 p0 = reinterpret_cast<const uint4*>(act)[2 * t], p1 = reinterpret_cast<const uint4*>(act)[2 * t + 1];
    const uint32_t b00[2] = {p0.x, p0.y}, b01[2] = {p0.z, p0.w}, b10[2] = {p1.x, p1.y}, b11[2] = {p1.z, p1.w};
    const float sa = sums[0] + sums[1];  // sum of the activations (zero points)
    for (int rg = w; rg < H / 16; rg += kWarps) {
      const uint2 wl = *reinterpret_cast<const uint2*>(dn_s + 32 * (16 * rg + g) + 8 * t);
      const uint2 wh = *reinterpret_cast<const uint2*>(dn_s + 32 * (16 * rg + g + 8) + 8 * t);
      const uint32_t wlo[2] = {wl.x, wl.y}, whi[2] = {wh.x, wh.y};
      float c[4] = {};
      if ((ABL & 96) == 96) {  // the probe's slice: words kb 0..3 of lane (g, t), each a whole A fragment
        const uint4 wd = *reinterpret_cast<const uint4*>(dn_s + 16 * (rg * 32 + lane));
        const uint32_t words[4] = {wd.x, wd.y, wd.z, wd.w};
        const uint32_t* ah = reinterpret_cast<const uint32_t*>(act);
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          uint32_t a[4];
          q4_pairs(words[kb], a);
          const uint32_t bb[2] = {ah[8 * kb + t], ah[8 * kb + 4 + t]};
          mma_16816(c, a, bb);
        }
      } else {
        uint32_t pl[4], ph[4];
        q4_pairs(wlo[0], pl);
        q4_pairs(whi[0], ph);
        const uint32_t a0[4] = {pl[0], ph[0], pl[1], ph[1]}, a1[4] = {pl[2], ph[2], pl[3], ph[3]};
        if (!(ABL & 2)) {
          mma_16816(c, a0, b00);
          mma_16816(c, a1, b01);
        } else {
          c[0] += __uint_as_float((a0[0] ^ a1[3] ^ b00[0]) & 0x3fffffffu);
        }
        q4_pairs(wlo[1], pl);
        q4_pairs(whi[1], ph);
        const uint32_t a2[4] = {pl[0], ph[0], pl[1], ph[1]}, a3[4] = {pl[2], ph[2], pl[3], ph[3]};
        if (!(ABL & 2)) {
          mma_16816(c, a2, b10);
          mma_16816(c, a3, b11);
        } else {
          c[2] += __uint_as_float((a2[0] ^ a3[3] ^ b10[0]) & 0x3fffffffu);
        }
      }
      const int r_lo = 16 * rg + g, r_hi = r_lo + 8;
      float lo = c[0], hi = c[2];
      if (dn_zeros != nullptr) {
        lo -= (__half2float(dzs[r_lo]) - 8.f) * sa;
        hi -= (__half2float(dzs[r_hi]) - 8.f) * sa;
      }
      lo *= __half2float(dsc[r_lo]);
      hi *= __half2float(dsc[r_hi]);
      // lanes 0 and 16 (t = 0, g = 0 and 4) gather four consecutive rows each
      const float lo1 = __shfl_down_sync(0xffffffffu, lo, 4), lo2 = __shfl_down_sync(0xffffffffu, lo, 8),
                  lo3 = __shfl_down_sync(0xffffffffu, lo, 12), hi1 = __shfl_down_sync(0xffffffffu, hi, 4),
                  hi2 = __shfl_down_sync(0xffffffffu, hi, 8), hi3 = __shfl_down_sync(0xffffffffu, hi, 12);
      if ((lane & 15) == 0) {
        red_add4(acc + r_lo, lo, lo1, lo2, lo3);
        red_add4(acc + r_hi, hi, hi1, hi2, hi3);
      }
    }
  }
  if (b == 0)  // the residual, once: block 0 adds x
    for (int i = tid; i < H / 4; i += kThreads) {
      const uint2 v = __ldcg(reinterpret_cast<const uint2*>(x) + i);
      const float2 a = __half22float2(u32_as_h2(v.x)), c = __half22float2(u32_as_h2(v.y));
      red_add4(acc + 4 * i, a.x, a.y, c.x, c.y);
    }
}

}  // namespace mlp
}  // namespace grokc
