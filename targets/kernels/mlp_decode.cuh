// `mlp_decode` (kernel_abi): a batch-1 SwiGLU MLP in one launch, with no dependency between its
// gate_up and down halves. Block b owns intermediate outputs [64 b, 64 b + 64): it computes their
// activations from its 64 gate and 64 up rows, multiplies them by its 64 columns of W_down and adds
// the H partial sums into the f32 accumulator `acc` with vector reductions (block 0 adds x, the
// residual, too). Nothing waits for the whole grid: the launch after reads `acc` once this grid is
// complete (griddepcontrol.wait). Every weight byte of a block (8 gate/up tiles, the down slice) is
// requested by bulk copies at entry, before griddepcontrol.wait, and the next launch is let in at
// once, so the stream runs while the launch before finishes (bench/probes/mlp_probe.py times it;
// docs/performance.md, runs 82 and 89-92).
//
// The weights come in artifacts/mlp_tiles.py's layouts (`pack_mlp_tiles` below writes them at load):
// a gate/up tile is 16 rows (8 gate, the 8 up rows of the same outputs) as mma.m16n8k16 A fragments,
// 16 bytes a lane a 64-column chunk; the down slice of block b is rows 16 rg .. 16 rg + 15 of
// columns 64 b .. 64 b + 63, row group after row group. Each word is one MMA's A as q4_raw reads it
// (common.cuh: the codes as f16 subnormals, rows 8..15 at 16 times the scale of rows 0..7; the
// epilogues take the scales and the codes' offsets out). x (times the norm's gamma) is staged once
// as B fragments; every column of B holds x, so the sums sit in every column of C.
//
// Requirements (targets/rules_mlp.py checks them): sm_90, H % 256 == 0, H <= 2048, I % 64 == 0,
// q4 per output channel; 512 threads; MLP_DECODE_SMEM(H) bytes of dynamic shared memory.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"
#include "pdl.cuh"

#define MLP_DECODE_SMEM(H) (102 * (H) + 2560)

namespace grokc {
namespace mlp {

constexpr int kWarps = 16, kThreads = 32 * kWarps, kUnits = 64;
constexpr int kTiles = kUnits / 8;          // gate/up tiles a block (8 outputs each)
constexpr int kSplit = kWarps / kTiles;     // warps per tile, each half its chunks
constexpr int kDownCopies = 4;              // bulk copies of the down slice (a barrier each)

// Shared memory of a block, in bytes from the start.
template <int H>
struct Smem {
  static constexpr int kTile = 8 * H, kDown = kUnits * H / 2;
  static constexpr int kGateUp = 0, kDownAt = kTiles * kTile, kX = kDownAt + kDown;  // x: B fragments
  static constexpr int kDownScales = kX + 2 * H, kDownZeros = kDownScales + 2 * H;    // f16 [H] each
  static constexpr int kRows = kDownZeros + 2 * H;    // f32 [4][64]: gate, up scales; gate, up zero points (8 without)
  static constexpr int kAct = kRows + 4 * 4 * kUnits; // f16 [64]
  static constexpr int kPart = kAct + 256;            // f32 [warps][16]: gate/up partial sums
  static constexpr int kSums = kPart + 4 * 16 * kWarps;  // f32 [32]
  static constexpr int kBars = kSums + 128;           // u64 [kTiles + kDownCopies]
  static constexpr int kBytes = kBars + 128;
  static_assert(kBytes == MLP_DECODE_SMEM(H), "MLP_DECODE_SMEM");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint2 b) {
  const uint32_t bb[2] = {b.x, b.y};
  mma_16816(c, a, bb);
}

template <int H>
__device__ __forceinline__ void mlp_decode(float* acc, float* clear, const half* x, const half* __restrict__ norm,
                                           const uint8_t* __restrict__ gate_up_tiles,
                                           const half* __restrict__ gate_up_scales,
                                           const half* __restrict__ gate_up_zeros,
                                           const uint8_t* __restrict__ down_tiles,
                                           const half* __restrict__ down_scales,
                                           const half* __restrict__ down_zeros, int hidden, int inter, float eps) {
  using S = Smem<H>;
  constexpr int kPieces = H / 8;          // 16-byte pieces of x
  constexpr int kChunks = H / 64;         // 64-column chunks of a gate/up row
  constexpr int kRowGroups = H / 16;      // of the down slice
  constexpr int kRgPerWarp = kRowGroups / kWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint2* xs = reinterpret_cast<uint2*>(smem + S::kX);
  half* dsc = reinterpret_cast<half*>(smem + S::kDownScales);
  half* dz = reinterpret_cast<half*>(smem + S::kDownZeros);
  float* rows = reinterpret_cast<float*>(smem + S::kRows);
  half* act = reinterpret_cast<half*>(smem + S::kAct);
  float* part = reinterpret_cast<float*>(smem + S::kPart);
  float* sums = reinterpret_cast<float*>(smem + S::kSums);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, b = blockIdx.x;

  // Before the wait: every weight byte of the block, the down scales and zeros, the gate/up rows'
  // scales and zeros, gamma (none of them depends on the launch before).
  if (tid == 0) {
    for (int i = 0; i < kTiles + kDownCopies; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + i)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    for (int i = 0; i < kTiles; ++i)
      bulk_copy(smem + S::kGateUp + i * S::kTile, gate_up_tiles + ((size_t)b * kTiles + i) * S::kTile, S::kTile,
                bars + i);
    for (int i = 0; i < kDownCopies; ++i)
      bulk_copy(smem + S::kDownAt + i * (S::kDown / kDownCopies),
                down_tiles + (size_t)b * S::kDown + i * (S::kDown / kDownCopies), S::kDown / kDownCopies,
                bars + kTiles + i);
  }
  uint4 gamma = make_uint4(0, 0, 0, 0);
  if (tid < kPieces) {
    gamma = __ldg(reinterpret_cast<const uint4*>(norm) + tid);
    reinterpret_cast<uint4*>(dsc)[tid] = __ldg(reinterpret_cast<const uint4*>(down_scales) + tid);
    reinterpret_cast<uint4*>(dz)[tid] = down_zeros ? __ldg(reinterpret_cast<const uint4*>(down_zeros) + tid)
                                                   : make_uint4(0x48004800u, 0x48004800u, 0x48004800u, 0x48004800u);
  }
  if (tid < 2 * kUnits) {  // gate rows 64 b .., then up rows inter + 64 b ..
    const int row = (tid < kUnits ? 0 : inter - kUnits) + kUnits * b + tid;
    rows[tid] = __half2float(gate_up_scales[row]);
    rows[2 * kUnits + tid] = gate_up_zeros ? __half2float(gate_up_zeros[row]) : 8.f;
  }
  grokc_pdl_launch_dependents();
  grokc_pdl_wait();
  for (int i = b * kThreads + tid; i < H; i += gridDim.x * kThreads) clear[i] = 0.f;

  // x * gamma as B fragments (piece tid: halves 8 tid .. 8 tid + 7 of k block tid / 2), the sums of
  // x^2 (the norm) and of x * gamma (the zero points)
  if (tid < kPieces) {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(x) + tid);
    const uint32_t* hv = reinterpret_cast<const uint32_t*>(&v);
    const uint32_t* hg = reinterpret_cast<const uint32_t*>(&gamma);
    uint32_t* dst = reinterpret_cast<uint32_t*>(xs + (tid >> 1) * 4) + (tid & 1);
    float sq = 0.f, sx = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(u32_as_h2(hv[e]));
      const __half2 xg = __hmul2(u32_as_h2(hv[e]), u32_as_h2(hg[e]));
      const float2 fg = __half22float2(xg);
      sq += f.x * f.x + f.y * f.y;
      sx += fg.x + fg.y;
      dst[2 * e] = h2_as_u32(xg);
    }
    sq = warp_sum(sq);
    sx = warp_sum(sx);
    if (lane == 0) sums[w] = sq, sums[8 + w] = sx;
  }
  __syncthreads();
  GROKC_TRACE_MARK(0);
  float ssq = 0.f, sxg = 0.f;
#pragma unroll
  for (int i = 0; i < kPieces / 32; ++i) ssq += sums[i], sxg += sums[8 + i];
  const float rms = rsqrtf(ssq / H + eps);

  // gate_up: warps 2j, 2j + 1 take tile j (gate rows 64 b + 8 j + g, up rows alike), half its chunks each
  {
    const int tile = w / kSplit, c0 = (w % kSplit) * (kChunks / kSplit);
    bar_wait(bars + tile);
    const uint8_t* words = smem + S::kGateUp + tile * S::kTile;
    float c[8][4] = {};
#pragma unroll 4
    for (int q = c0; q < c0 + kChunks / kSplit; ++q) {
      const uint4 wd = *reinterpret_cast<const uint4*>(words + 16 * (q * 32 + lane));
      const uint32_t wv[4] = {wd.x, wd.y, wd.z, wd.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
        q4_raw(wv[j], a);
        mma(c[(4 * q + j) & 7], a, xs[(4 * q + j) * 4 + t]);
      }
    }
    float gate = 0.f, up = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) gate += c[i][0], up += c[i][2];
    gate *= kRawLo, up *= kRawHi;
    if (t == 0) part[w * 16 + g] = gate, part[w * 16 + 8 + g] = up;
  }
  __syncthreads();
  GROKC_TRACE_MARK(1);
  if (tid < kUnits) {  // output 8 j + gg of tile j
    const int j = tid >> 3, gg = tid & 7;
    float gate = 0.f, up = 0.f;
#pragma unroll
    for (int s = 0; s < kSplit; ++s)
      gate += part[(j * kSplit + s) * 16 + gg], up += part[(j * kSplit + s) * 16 + 8 + gg];
    gate = (gate - rows[2 * kUnits + tid] * sxg) * rows[tid] * rms;
    up = (up - rows[3 * kUnits + tid] * sxg) * rows[kUnits + tid] * rms;
    act[tid] = __float2half_rn(gate / (1.f + __expf(-gate)) * up);
    const float a = warp_sum(__half2float(act[tid]));  // for the down rows' zero points
    if (lane == 0) sums[20 + w] = a;
  }
  __syncthreads();
  GROKC_TRACE_MARK(2);
  const float sum_act = sums[20] + sums[21];

  // down: warp w takes row groups kRgPerWarp w .. of the block's columns; rows 16 rg + g (c[0]) and
  // + 8 (c[2]); lanes 0 and 16 gather four consecutive rows each and add them into acc
  {
    uint2 ab[4];
    const uint32_t* ah = reinterpret_cast<const uint32_t*>(act);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) ab[kb] = make_uint2(ah[8 * kb + t], ah[8 * kb + 4 + t]);
    bar_wait(bars + kTiles + w * kDownCopies / kWarps);
#pragma unroll 4
    for (int r = 0; r < kRgPerWarp; ++r) {
      const int rg = kRgPerWarp * w + r;
      const uint4 wd = *reinterpret_cast<const uint4*>(smem + S::kDownAt + 16 * (rg * 32 + lane));
      const uint32_t wv[4] = {wd.x, wd.y, wd.z, wd.w};
      float c[4] = {};
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t a[4];
        q4_raw(wv[kb], a);
        mma(c, a, ab[kb]);
      }
      const int lo_row = 16 * rg + g, hi_row = lo_row + 8;
      const float lo = (c[0] * kRawLo - __half2float(dz[lo_row]) * sum_act) * __half2float(dsc[lo_row]);
      const float hi = (c[2] * kRawHi - __half2float(dz[hi_row]) * sum_act) * __half2float(dsc[hi_row]);
      const float lo1 = __shfl_down_sync(0xffffffffu, lo, 4), lo2 = __shfl_down_sync(0xffffffffu, lo, 8),
                  lo3 = __shfl_down_sync(0xffffffffu, lo, 12);
      const float hi1 = __shfl_down_sync(0xffffffffu, hi, 4), hi2 = __shfl_down_sync(0xffffffffu, hi, 8),
                  hi3 = __shfl_down_sync(0xffffffffu, hi, 12);
      if ((lane & 15) == 0) {
        red_add4(acc + lo_row, lo, lo1, lo2, lo3);
        red_add4(acc + hi_row, hi, hi1, hi2, hi3);
      }
    }
  }
  if (b == 0)  // the residual, once
    for (int i = tid; i < H / 4; i += kThreads) {
      const uint2 hv = __ldcg(reinterpret_cast<const uint2*>(x) + i);
      const float2 p0 = __half22float2(u32_as_h2(hv.x)), p1 = __half22float2(u32_as_h2(hv.y));
      red_add4(acc + 4 * i, p0.x, p0.y, p1.x, p1.y);
    }
}

// `pack_mlp_tiles` (kernel_abi; layouts in artifacts/mlp_tiles.py): one thread a u32 word of `out`,
// gathering its 8 codes from the row-major q4 weight (abi/int4.py: code e of a run of 8 lies in
// nibble (e >> 1) + 4 (e & 1)). Runs once, in the init graph.
__device__ __forceinline__ void pack_mlp_tiles(uint8_t* out, const uint8_t* weight, int part, int hidden, int inter) {
  const bool gate_up = part == 0;
  const int k = gate_up ? hidden : inter, units = gate_up ? inter / 8 : hidden / 16, chunks = k / 64;
  const size_t n_words = (size_t)units * chunks * 128;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(weight);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_words; i += (size_t)gridDim.x * blockDim.x) {
    const int in_block = (int)(i & 127), lane = in_block >> 2, g = lane >> 2, t = lane & 3;
    const size_t blk = i >> 7;
    const int unit = gate_up ? (int)(blk / chunks) : (int)(blk % units);
    const int chunk = gate_up ? (int)(blk % chunks) : (int)(blk / units);
    const int kb = 4 * chunk + (in_block & 3);
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // nibble j: unit row g (+ 8 for odd j), column 16 kb + 2t + {0, 8, 1, 9}[j / 2]
      const int ur = g + 8 * (j & 1);
      const int row = gate_up ? (ur < 8 ? 8 * unit + ur : inter + 8 * unit + ur - 8) : 16 * unit + ur;
      const int col = 16 * kb + 2 * t + ((j >> 1) & 1) * 8 + (j >> 2);
      const int e = col & 7;
      const uint32_t code = (src[(size_t)row * (k / 8) + col / 8] >> (4 * ((e >> 1) + 4 * (e & 1)))) & 0xFu;
      word |= code << (4 * j);
    }
    reinterpret_cast<uint32_t*>(out)[i] = word;
  }
}

}  // namespace mlp
}  // namespace grokc
