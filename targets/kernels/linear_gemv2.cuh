// `linear` for decode batches of 1..8 rows of x: a weight-streaming GEMV, weights as the A operand
// of mma.m16n8k16 ("swap AB"), x as B (its 8 columns are the batch rows).
//
// Why this shape. At M <= 8 every weight byte is read once and used for M multiply-adds, so the
// kernel must keep HBM busy and spend few instructions per weight byte, the same at M = 1 and
// M = 8. With the weights as A, one MMA multiplies 16 weight rows by 16 k by all 8 batch columns:
// the same instruction stream serves M = 1..8 (at M = 1 seven columns are idle, which costs
// nothing: the dequantisation, not the MMA, is the work per byte), and the MMA sums over the 4
// lanes that share a row, so no shuffles are needed.
//
// Lanes and weights. Lane (g, t) = (lane / 4, lane % 4) of a warp loads, per "step" and per row
// group of 16 A rows, one 16-byte chunk of A row g and one of A row g + 8, both at
// k = step * STEP_K + t * CK (CK = 32 codes of int4, 16 of int8, 8 halves of f16; STEP_K = 4 * CK):
// a warp load covers 64 contiguous bytes of 8 rows. In the MMA, logical k columns (2t, 2t+1) and
// (2t+8, 2t+9) are physical pairs of lane t's chunk: the chunk is NP = CK / 8 pieces of 8
// consecutive k, and piece v feeds two MMAs, its pairs 0/1 then 2/3 (a_pairs: for int4 piece v is
// word v, in the pair order abi/int4.py packs for the magic-number conversion; for int8 words
// 2v and 2v + 1, one code per byte; for f16 the chunk's 4 half2). B row (2t, 2t+1) of column g is
// then x[g] at those same physical k, read from shared memory with one 16-byte load per piece.
//
// A rows: act none: 16 consecutive weight rows; gated: A rows 0..7 are gate rows n..n+7 and
// rows 8..15 the up rows N+n..N+n+7, so D[g] (gate) and D[g+8] (up) of output n+g land in the same
// lane and the epilogue needs no exchange.
//
// int4 -> half2 without conversions: (w & 0x000F000F) | 0x64006400 is (1024 + e0, 1024 + e1) and
// (w & 0x00F000F0) | 0x64006400 is (1024 + 16 e2, 1024 + 16 e3); one hsub2 (1032) or one hfma2
// (x / 16 - 72) gives (e - 8) exactly, 9 instructions per 8 codes (w >> 8 serves pairs 2, 3).
// Per-channel scales and zeros: the row's (z - 8) is subtracted in f16 (one more hsub2, only with
// zeros), the scale multiplies the fp32 sum. Groups: (e - 8) * s - (z - 8) * s by hfma2 per pair.
// Per-channel int4 with R >= 2 row groups or NL = 1 (the rule's tiling for M > 4) reads the codes
// raw instead (RAW; common.cuh's q4_raw): masks alone make them f16 subnormals at 2^-24 (pairs
// 0-1, 4-5) and 2^-20 (pairs 2-3, 6-7), one accumulator per scale, and the offset (zero point, else
// 8) comes off the finished sum times the sum of x, which two more MMAs a piece gather (A = ones).
// 5 instructions per 8 codes and no zero-point hsub2. Those two MMAs do not pay for one row group
// at M = 1 (the o projection at batch 1: +2.5 us a Llama-1B step on the H200, against -2 us for
// qkv at R = 2 and -26 us at batch 8; docs/performance.md, run 99).
// int8 -> half2: prmt (byte permute) puts code bytes 0, 1 (and 2, 3) under the byte 0x64, giving
// (1024 + b0, 1024 + b1); one hsub2 (1152) gives (b - 128) exactly, 4 instructions per 4 codes;
// per row only (scale on the fp32 sum, (z - 128) by one more hsub2).
//
// Work split. A block has KS * WN warps: warp (ks, wn) streams R row groups (16 A rows each) over
// the steps ks, ks + KS, ... (split-K inside the block); the block owns WN * R row groups. Every
// lane keeps a ring of D steps of weight loads (2 * R * D 16-byte loads) in flight: step i is
// computed, then its registers are refilled with step i + D. KS > 1: partial sums meet in shared
// memory and all threads run the epilogue; KS == 1: each lane finishes its own outputs.
//
// Order inside the kernel (programmatic dependent launch, sm_90+): let the next kernel launch,
// issue the first D steps of weight loads and the per-row scales (weights do not depend on the
// previous kernel), then griddepcontrol.wait, and only then read x / norm / residual or write.
// TR 1 moves the trigger after the wait: for tilings whose warps load all their weights before it,
// the next kernel's early blocks would only compete with the kernel before this one.
// Without a programmatic edge both instructions are no-ops; before sm_90 they compile to nothing.
//
// x in shared memory: x (and norm) are copied once per block with cp.async into rows of
// KP = roundup(K, 128) halves, zero past K, 16-byte pieces XOR-swizzled so the B loads are free
// of bank conflicts. With a norm, NL = 0: one pass over the staged x gathers each row's sum of
// squares (fp32) and multiplies x by norm in place (rounded to f16 once); NL = 1: no pass, each
// step multiplies its x by norm in registers and one more MMA per 16 k (A = B = raw x) adds to
// x x^T, whose diagonal is the sums of squares (the pass costs M * K per block: cheaper at
// M = 1, dearer at M = 8). Either way the rms factor multiplies the finished sums. PF picks the
// L2 prefetch of the weight loads (0 none, 1 128 B, 2 256 B). Dynamic shared memory (Gemv2.smem
// in rules_linear.py computes the same):
//   (M + 1) * KP * 2   (x rows, norm row)
// + NWARP * 8 * 4      (sums of squares: per warp with NL = 0, per K slice with NL = 1)
// + [KS > 1] KS * M * 16 * R * WN * 4   (partial sums)
//
// Requirements (checked by the rule): 1 <= M <= 8; f16: K % 8 == 0; int4: K % 32 == 0 and, with
// groups, group_size % 32 == 0; int8: K % 16 == 0, one scale per row (group_size 0 or >= K).
#pragma once

#include "linear_common.cuh"
#include "pdl.cuh"

namespace grokc {
namespace gemv2 {

using namespace linear;

constexpr int MAXM = 8;

// Physical 16-byte piece of logical piece p in staged row m (rows are a multiple of 16 pieces).
// int4 steps read pieces 16s + 4t + w, int8 steps 8s + 2t + v, f16 steps 4s + t; all are
// conflict-free per 8-lane phase (lanes g = 0, 1 read rows 0, 1 at the same p: row 1 moves to the
// other half of the 128 bytes).
template <int WF>
__device__ __forceinline__ int swz(int m, int p) {
    if (WF == F16) return p ^ ((m & 1) << 2);
    if (WF == Q8) return p ^ (m & 1);
    return p ^ (((p >> 3) & 1) << 1) ^ (m & 1);
}

// A 16-byte weight load: read once, so no L1 allocation; PF asks L2 to fetch the surrounding
// 128 (PF = 1) or 256 (PF = 2) bytes of the row with it (the next steps' data), or nothing (0).
template <int PF>
__device__ __forceinline__ uint4 ldg_w(const void* p) {
    uint4 v;
    if (PF == 2)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else if (PF == 1)
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    return h2_as_u32(__hmul2(u32_as_h2(a), u32_as_h2(b)));
}

// Four half2 (e_{2i} - 8, e_{2i+1} - 8), i = 0..3, of one int4 word (abi/int4.py layout).
__device__ __forceinline__ void q4_pairs(uint32_t w, uint32_t p[4]) {
    const uint32_t MAGIC = 0x64006400u;
    const __half2 B_LO = u32_as_h2(0x64086408u);   // (1032, 1032)
    const __half2 S_HI = u32_as_h2(0x2C002C00u);   // (1/16, 1/16)
    const __half2 B_HI = u32_as_h2(0xD480D480u);   // (-72, -72)
    const uint32_t w8 = w >> 8;
    p[0] = h2_as_u32(__hsub2(u32_as_h2(lop3_and_or(w, 0x000F000Fu, MAGIC)), B_LO));
    p[1] = h2_as_u32(__hfma2(u32_as_h2(lop3_and_or(w, 0x00F000F0u, MAGIC)), S_HI, B_HI));
    p[2] = h2_as_u32(__hsub2(u32_as_h2(lop3_and_or(w8, 0x000F000Fu, MAGIC)), B_LO));
    p[3] = h2_as_u32(__hfma2(u32_as_h2(lop3_and_or(w8, 0x00F000F0u, MAGIC)), S_HI, B_HI));
}

// A residual element as the f16 it stands for (IO's R32: the f32 sum, rounded).
template <int IO>
__device__ __forceinline__ __half res_h(const __half* residual, size_t i) {
    if constexpr ((IO & R32) != 0) return __float2half_rn(reinterpret_cast<const float*>(residual)[i]);
    else return residual[i];
}

// Bytes of a weight row's first k columns: 2k (f16), k (int8), k / 2 (int4).
template <int WF>
__device__ __forceinline__ size_t weight_bytes(int k) {
    return WF == F16 ? static_cast<size_t>(k) * 2 : WF == Q8 ? static_cast<size_t>(k) : static_cast<size_t>(k) / 2;
}

// Two half2 (b0 - 128, b1 - 128) and (b2 - 128, b3 - 128) of one word of int8 codes (abi/int8.py:
// byte i is the code of k + i, so the pairs are consecutive k like f16's and int4's). prmt puts each
// code byte under the byte 0x64, which is the f16 1024 + b exactly; one hsub2 of 1152 leaves b - 128,
// exact (|b - 128| <= 128): 4 instructions per 4 codes.
__device__ __forceinline__ void q8_pairs(uint32_t w, uint32_t* p) {
    const uint32_t EXP = 0x64646464u;
    const __half2 BIAS = u32_as_h2(0x64806480u);   // (1152, 1152)
    p[0] = h2_as_u32(__hsub2(u32_as_h2(__byte_perm(w, EXP, 0x5150u)), BIAS));
    p[1] = h2_as_u32(__hsub2(u32_as_h2(__byte_perm(w, EXP, 0x5352u)), BIAS));
}

// The four half2 of piece v (8 consecutive k: pairs 0-1, 2-3, 4-5, 6-7) of a lane's 16-byte chunk of
// one A row: f16 as stored (v = 0), int4 word v (q4_pairs), int8 words 2v and 2v + 1 (q8_pairs);
// codes come out minus their symmetric code, exactly.
template <int WF>
__device__ __forceinline__ void a_pairs(const uint4& c, int v, uint32_t p[4]) {
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    if (WF == F16) {
        p[0] = c.x, p[1] = c.y, p[2] = c.z, p[3] = c.w;
    } else if (WF == Q8) {
        q8_pairs(w[2 * v], p);
        q8_pairs(w[2 * v + 1], p + 2);
    } else {
        q4_pairs(w[v], p);
    }
}

template <int WF, int ACT, bool OUT_F32, int R, int KS, int WN, int D, int PF, int NL, int TR, int IO, bool NORM, bool ZERO>
__device__ __forceinline__ void body(GROKC_LINEAR_PARAMS) {
    constexpr int NWARP = KS * WN;
    constexpr int NT = 32 * NWARP;
    constexpr int CK = (WF == F16) ? 8 : (WF == Q8) ? 16 : 32;  // k per 16-byte chunk
    constexpr int NP = CK / 8;                          // 16-byte pieces of staged x per chunk
    constexpr int STEP_K = 4 * CK;                      // k per step (4 lanes t)
    constexpr bool PER_ROW = WF == Q4 || WF == Q8;      // one scale (and zero) per row, on the fp32 sums
    constexpr bool RAW = WF == Q4 && (R >= 2 || NL == 1);  // codes as f16 subnormals (q4_raw); see the top
    constexpr int BR = 16 * R * WN;                     // A rows per block
    constexpr int OC = (ACT != NONE) ? BR / 2 : BR; // outputs per block
    constexpr bool NPASS = NORM && NL == 0;             // norm applied by a pass over staged x
    constexpr bool NLOOP = NORM && NL == 1;             // ... or per step, in registers
    extern __shared__ __align__(16) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ks = warp % KS, wn = warp / KS;
    const int g = lane >> 2, t = lane & 3;

    const int nsteps = (K + STEP_K - 1) / STEP_K;
    const int KP = (K + 127) & ~127;                    // staged halves per row
    const int my = ks < nsteps ? (nsteps - ks + KS - 1) / KS : 0;  // steps of this warp
    const size_t row_bytes = weight_bytes<WF>(K);
    const int G = (WF == Q4G) ? (K + group_size - 1) / group_size : 1;

    __half* xs = reinterpret_cast<__half*>(smem);                       // [M][KP]
    __half* ns = xs + static_cast<size_t>(M) * KP;                      // [KP]
    float* wsum = reinterpret_cast<float*>(ns + KP);  // [NWARP][8] sums of squares (NL 1: [KS][8])
    float* red = wsum + NWARP * MAXM;                                   // [KS][M][BR]

    if (TR == 0) grokc_pdl_launch_dependents();

    // ---- this lane's rows: A row g and g + 8 of each row group j --------------------------------
    const unsigned char* wlo[R];  // A row g of group j
    const unsigned char* whi[R];  // A row g + 8
    int out_n[R];                 // none: weight row of A row g (A row g + 8 is out_n + 8); silu: output n
    const unsigned char* w0 = static_cast<const unsigned char*>(weight);
#pragma unroll
    for (int j = 0; j < R; ++j) {
        const int grp = (blockIdx.x * WN + wn) * R + j;
        // rows past N read row 0 (their results are never stored)
        if (ACT != NONE) {
            out_n[j] = grp * 8 + g;
            const int n = out_n[j] < N ? out_n[j] : 0;
            wlo[j] = w0 + static_cast<size_t>(n) * row_bytes;
            whi[j] = w0 + static_cast<size_t>(N + n) * row_bytes;
        } else {
            out_n[j] = grp * 16 + g;
            wlo[j] = w0 + static_cast<size_t>(out_n[j] < N ? out_n[j] : 0) * row_bytes;
            whi[j] = w0 + static_cast<size_t>(out_n[j] + 8 < N ? out_n[j] + 8 : 0) * row_bytes;
        }
    }
    // the row index of A row g + 8 for scale / zero lookups
    auto row_hi = [&](int j) { return ACT != NONE ? N + out_n[j] : out_n[j] + 8; };
    auto row_ok_lo = [&](int j) { return out_n[j] < N; };
    auto row_ok_hi = [&](int j) { return ACT != NONE ? out_n[j] < N : out_n[j] + 8 < N; };

    // ---- the ring of weight loads ------------------------------------------------------------------
    uint4 ring[D][R][2];
    __half2 gsc[D][R][2], gzs[D][R][2];  // Q4G: group scale and -(z - 8) * scale of each chunk
    auto load_step = [&](int d, int i) {
        const int s = ks + i * KS;
        const int kc = s * STEP_K + t * CK;
        const bool ok = kc < K;
        const size_t off = weight_bytes<WF>(kc);
#pragma unroll
        for (int j = 0; j < R; ++j) {
            ring[d][j][0] = ok ? ldg_w<PF>(wlo[j] + off) : make_uint4(0u, 0u, 0u, 0u);
            ring[d][j][1] = ok ? ldg_w<PF>(whi[j] + off) : make_uint4(0u, 0u, 0u, 0u);
            if (WF == Q4G) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = h == 0 ? (row_ok_lo(j) ? out_n[j] : 0) : (row_ok_hi(j) ? row_hi(j) : 0);
                    const size_t gi = static_cast<size_t>(row) * G + (ok ? kc / group_size : 0);
                    const __half sc = scales[gi];
                    gsc[d][j][h] = __half2half2(sc);
                    gzs[d][j][h] = ZERO ? __half2half2(__hneg(__hmul(__hsub(zeros[gi], __float2half_rn(8.f)), sc)))
                                        : __float2half2_rn(0.f);
                }
            }
        }
    };

    // per-row scale (Q4, Q8) and (zero - symmetric code) (with zeros), read before the wait like the weights
    float sc_lo[R], sc_hi[R];
    float off_lo[R], off_hi[R];   // RAW: the codes' offset, the zero point (else 8)
    __half2 zd_lo[R], zd_hi[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
        sc_lo[j] = sc_hi[j] = 1.f;
        off_lo[j] = off_hi[j] = 8.f;
        zd_lo[j] = zd_hi[j] = __float2half2_rn(0.f);
        if (PER_ROW) {
            const int rl = row_ok_lo(j) ? out_n[j] : 0, rh = row_ok_hi(j) ? row_hi(j) : 0;
            sc_lo[j] = __half2float(scales[rl]);
            sc_hi[j] = __half2float(scales[rh]);
            if (RAW && ZERO) {
                off_lo[j] = __half2float(zeros[rl]);
                off_hi[j] = __half2float(zeros[rh]);
            } else if (ZERO) {
                const __half sym = __float2half_rn(WF == Q8 ? 128.f : 8.f);
                zd_lo[j] = __half2half2(__hsub(zeros[rl], sym));
                zd_hi[j] = __half2half2(__hsub(zeros[rh], sym));
            }
        }
    }

#pragma unroll
    for (int d = 0; d < D; ++d)
        if (d < my) load_step(d, d);

    grokc_pdl_wait();  // the previous kernel's x / norm / residual are complete from here on
    if (TR == 1) grokc_pdl_launch_dependents();

    // ---- residual of this thread's outputs, early (its latency hides behind the weights) --------
    // KS == 1: lane outputs (m = 2t + h, A row g / g + 8 of group j); KS > 1: e = tid + i * NT.
    constexpr int EPT = (OC * MAXM + NT - 1) / NT;
    constexpr int NRES = KS == 1 ? 4 * R : EPT;
    __half res[NRES];
#pragma unroll
    for (int i = 0; i < NRES; ++i) res[i] = __float2half_rn(0.f);
    if (residual != nullptr) {
        if (KS == 1) {
#pragma unroll
            for (int j = 0; j < R; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = 2 * t + h;
                    if (m >= M) continue;
                    if (row_ok_lo(j)) res[4 * j + 2 * h] = res_h<IO>(residual, static_cast<size_t>(m) * N + out_n[j]);
                    if (ACT == NONE && row_ok_hi(j))
                        res[4 * j + 2 * h + 1] = res_h<IO>(residual, static_cast<size_t>(m) * N + out_n[j] + 8);
                }
        } else {
#pragma unroll
            for (int i = 0; i < EPT; ++i) {
                const int e = tid + i * NT;
                const int m = e / OC, n = blockIdx.x * OC + (e - m * OC);
                if (m < M && n < N) res[i] = res_h<IO>(residual, static_cast<size_t>(m) * N + n);
            }
        }
    }

    // ---- stage x (and norm) ----------------------------------------------------------------------
    {
        const int P = KP / 8;
        for (int idx = tid; idx < M * P; idx += NT) {
            const int m = idx / P, p = idx - m * P, k = p * 8;
            const bool ok = k < K;
            __half* dst = xs + static_cast<size_t>(m) * KP + swz<WF>(m, p) * 8;
            if constexpr ((IO & X32) != 0) {  // f32 x: two 16-byte loads rounded to 8 halves
                const float4* x32 = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(x) + static_cast<size_t>(m) * K + k);
                *reinterpret_cast<uint4*>(dst) = ok ? f32x8_to_h8(__ldcg(x32), __ldcg(x32 + 1)) : make_uint4(0u, 0u, 0u, 0u);
            } else {
                cp_async16(dst, ok ? static_cast<const void*>(x + static_cast<size_t>(m) * K + k) : static_cast<const void*>(x), ok);
            }
        }
        if (NORM) {
            for (int p = tid; p < P; p += NT) {
                const int k = p * 8;
                // NL 1 reads norm beside x in the B pattern: swizzled like x row 0
                cp_async16(ns + (NLOOP ? swz<WF>(0, p) : p) * 8,
                           k < K ? static_cast<const void*>(norm + k) : static_cast<const void*>(norm), k < K);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        GROKC_TRACE_MARK(0);
        if (NPASS) {
            for (int m = 0; m < M; ++m) {  // block-uniform loops: the shuffles below are safe
                float ss = 0.f;
                for (int p = tid; p < P; p += NT) {
                    __half* at = xs + static_cast<size_t>(m) * KP + swz<WF>(m, p) * 8;
                    uint4 v = lds16(at);
                    ss += sumsq8(v);
                    *reinterpret_cast<uint4*>(at) = hmul8(v, lds16(ns + p * 8));
                }
                ss = warp_sum(ss);
                if (lane == 0) wsum[warp * MAXM + m] = ss;
            }
            __syncthreads();
            GROKC_TRACE_MARK(1);
        }
    }

    // ---- main loop ---------------------------------------------------------------------------------
    float acc[R][2][4];
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[j][a][c] = 0.f;

    float accsq[4] = {0.f, 0.f, 0.f, 0.f};  // NL 1: D[g][2t..2t+1] of x x^T (its diagonal: sums of squares)
    float accx[4] = {0.f, 0.f, 0.f, 0.f};   // RAW: D[*][2t..2t+1] of ones x^T, the sums of x (its k share)
    constexpr uint32_t ONES = 0x3C003C00u;  // (1, 1)
    const int xrow = g < M ? g : 0;  // batch columns past M read row 0; their sums are dropped
    const __half* xr = xs + static_cast<size_t>(xrow) * KP;

    auto compute = [&](int d, int i) {
        const int s = ks + i * KS;
        uint4 xv[NP];  // x of batch column g at the chunk's k: pieces s * 4 * NP + t * NP + v, 8 k each
#pragma unroll
        for (int v = 0; v < NP; ++v) xv[v] = lds16(xr + swz<WF>(xrow, s * 4 * NP + t * NP + v) * 8);
        if (NLOOP) {
#pragma unroll
            for (int v = 0; v < NP; ++v) {
                const uint4 nv = lds16(ns + swz<WF>(0, s * 4 * NP + t * NP + v) * 8);
                const uint32_t z = 0u;
                const uint32_t qa0[4] = {xv[v].x, z, xv[v].y, z}, qb0[2] = {xv[v].x, xv[v].y};
                const uint32_t qa1[4] = {xv[v].z, z, xv[v].w, z}, qb1[2] = {xv[v].z, xv[v].w};
                mma_16816(accsq, qa0, qb0);
                mma_16816(accsq, qa1, qb1);
                xv[v].x = hmul2_u32(xv[v].x, nv.x);
                xv[v].y = hmul2_u32(xv[v].y, nv.y);
                xv[v].z = hmul2_u32(xv[v].z, nv.z);
                xv[v].w = hmul2_u32(xv[v].w, nv.w);
            }
        }
        if constexpr (RAW) {
            // q4_raw's pairs 0-1, 4-5 (scale 2^-24) meet x's halves 0-1, 4-5 in one MMA, pairs 2-3,
            // 6-7 (2^-20) halves 2-3, 6-7 in the other, so each accumulator holds one scale
            const uint32_t ones[4] = {ONES, ONES, ONES, ONES};
#pragma unroll
            for (int v = 0; v < NP; ++v) {
                const uint32_t b0[2] = {xv[v].x, xv[v].z}, b1[2] = {xv[v].y, xv[v].w};
                mma_16816(accx, ones, b0);
                mma_16816(accx, ones, b1);
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    const uint4 lo = ring[d][j][0], hi = ring[d][j][1];
                    uint32_t pl[4], ph[4];
                    q4_raw(v == 0 ? lo.x : v == 1 ? lo.y : v == 2 ? lo.z : lo.w, pl);
                    q4_raw(v == 0 ? hi.x : v == 1 ? hi.y : v == 2 ? hi.z : hi.w, ph);
                    const uint32_t a0[4] = {pl[0], ph[0], pl[2], ph[2]}, a1[4] = {pl[1], ph[1], pl[3], ph[3]};
                    mma_16816(acc[j][0], a0, b0);
                    mma_16816(acc[j][1], a1, b1);
                }
            }
            return;
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
#pragma unroll
            for (int v = 0; v < NP; ++v) {
                uint32_t pl[4], ph[4];
                a_pairs<WF>(ring[d][j][0], v, pl);
                a_pairs<WF>(ring[d][j][1], v, ph);
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (PER_ROW && ZERO) {
                        pl[q] = h2_as_u32(__hsub2(u32_as_h2(pl[q]), zd_lo[j]));
                        ph[q] = h2_as_u32(__hsub2(u32_as_h2(ph[q]), zd_hi[j]));
                    }
                    if (WF == Q4G) {
                        pl[q] = h2_as_u32(__hfma2(u32_as_h2(pl[q]), gsc[d][j][0], gzs[d][j][0]));
                        ph[q] = h2_as_u32(__hfma2(u32_as_h2(ph[q]), gsc[d][j][1], gzs[d][j][1]));
                    }
                }
                const uint32_t a0[4] = {pl[0], ph[0], pl[1], ph[1]}, b0[2] = {xv[v].x, xv[v].y};
                const uint32_t a1[4] = {pl[2], ph[2], pl[3], ph[3]}, b1[2] = {xv[v].z, xv[v].w};
                mma_16816(acc[j][0], a0, b0);
                mma_16816(acc[j][1], a1, b1);
            }
        }
    };

    for (int i0 = 0; i0 < my; i0 += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int i = i0 + d;
            if (i < my) {  // warp-uniform
                compute(d, i);
                if (i + D < my) load_step(d, i + D);
            }
        }
    }

    if (RAW) {  // one sum a row: the two scales out, the offset times the sums of x off
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                acc[j][0][c] = acc[j][0][c] * kRawLo + acc[j][1][c] * kRawHi - (c < 2 ? off_lo[j] : off_hi[j]) * accx[c];
                acc[j][1][c] = 0.f;
            }
    }
    GROKC_TRACE_MARK(2);
    // ---- epilogue ----------------------------------------------------------------------------------
    // c[0..1] = D[g][2t..2t+1] (A row g, batch rows 2t, 2t+1), c[2..3] = D[g+8][2t..2t+1]
    // sum of squares of x row m: NL 0, from the pass's per-warp sums; NL 1, from the x x^T
    // accumulators (their diagonal D[m][m] sits in lane (m, m / 2), element m % 2) of every K slice
    auto rms = [&](int m) {
        if (!NORM) return 1.f;
        float ss = 0.f;
        if (NPASS) {
#pragma unroll
            for (int w = 0; w < NWARP; ++w) ss += wsum[w * MAXM + m];
        } else {
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) ss += wsum[kk * MAXM + m];
        }
        return rsqrtf(ss / static_cast<float>(K) + eps);
    };
    if (NLOOP && KS > 1 && wn == 0 && t == (g >> 1) && g < M) wsum[ks * MAXM + g] = (g & 1) ? accsq[1] : accsq[0];
    if (KS == 1) {
        float rs0, rs1;
        if (NLOOP) {  // this warp saw all of K
            const float d0 = __shfl_sync(0xffffffffu, accsq[0], 9 * t), d1 = __shfl_sync(0xffffffffu, accsq[1], 9 * t + 4);
            rs0 = rsqrtf(d0 / static_cast<float>(K) + eps);
            rs1 = rsqrtf(d1 / static_cast<float>(K) + eps);
        } else {
            rs0 = rms(2 * t < M ? 2 * t : 0);
            rs1 = rms(2 * t + 1 < M ? 2 * t + 1 : 0);
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
            float c[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) c[q] = acc[j][0][q] + acc[j][1][q];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 2 * t + h;
                if (m >= M) continue;
                const float rs = h ? rs1 : rs0;
                const size_t o = static_cast<size_t>(m) * N;
                if (ACT != NONE) {
                    if (!row_ok_lo(j)) continue;
                    float v = gate_act<ACT>(c[h] * sc_lo[j] * rs + addend_at<ACT>(addend, bias, m, out_n[j], N)) *
                              (c[2 + h] * sc_hi[j] * rs + addend_at<ACT>(addend, bias, m, N + out_n[j], N));
                    if (residual != nullptr) v += __half2float(res[4 * j + 2 * h]);
                    store(out, o + out_n[j], v, OUT_F32);
                } else {
                    if (row_ok_lo(j)) {
                        float v = c[h] * sc_lo[j] * rs + addend_at<ACT>(addend, bias, m, out_n[j], N);
                        if (residual != nullptr) v += __half2float(res[4 * j + 2 * h]);
                        store(out, o + out_n[j], v, OUT_F32);
                    }
                    if (row_ok_hi(j)) {
                        float v = c[2 + h] * sc_hi[j] * rs + addend_at<ACT>(addend, bias, m, out_n[j] + 8, N);
                        if (residual != nullptr) v += __half2float(res[4 * j + 2 * h + 1]);
                        store(out, o + out_n[j] + 8, v, OUT_F32);
                    }
                }
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const int a = (wn * R + j) * 16 + g;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 2 * t + h;
                if (m >= M) continue;
                float* r = red + static_cast<size_t>(ks * M + m) * BR;
                r[a] = (acc[j][0][h] + acc[j][1][h]) * sc_lo[j];
                r[a + 8] = (acc[j][0][2 + h] + acc[j][1][2 + h]) * sc_hi[j];
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < EPT; ++i) {
            const int e = tid + i * NT;
            const int m = e / OC, oc = e - m * OC;
            const int n = blockIdx.x * OC + oc;
            if (m >= M || n >= N) continue;
            const int a = ACT != NONE ? (oc / 8) * 16 + (oc % 8) : oc;
            float gate = 0.f, up = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                const float* r = red + static_cast<size_t>(kk * M + m) * BR;
                gate += r[a];
                if (ACT != NONE) up += r[a + 8];
            }
            const float rs = rms(m);
            gate = gate * rs + addend_at<ACT>(addend, bias, m, n, N);
            if (ACT != NONE) up = up * rs + addend_at<ACT>(addend, bias, m, N + n, N);
            float v = ACT != NONE ? gate_act<ACT>(gate) * up : gate;
            if (residual != nullptr) v += __half2float(res[i]);
            store(out, static_cast<size_t>(m) * N + n, v, OUT_F32);
        }
    }
}

template <int WF, int ACT, bool OUT_F32, int R, int KS, int WN, int D, int PF, int NL, int TR, int IO = 0>
__device__ __forceinline__ void linear_gemv2(GROKC_LINEAR_PARAMS) {
    static_assert(R >= 1 && KS >= 1 && WN >= 1 && D >= 1 && PF >= 0 && PF <= 2 && (NL == 0 || NL == 1)
                  && (TR == 0 || TR == 1), "tiling");
    constexpr bool Q = WF != F16;
    if (norm != nullptr) {
        if (Q && zeros != nullptr)
            body<WF, ACT, OUT_F32, R, KS, WN, D, PF, NL, TR, IO, true, Q>(GROKC_LINEAR_ARGS);
        else
            body<WF, ACT, OUT_F32, R, KS, WN, D, PF, NL, TR, IO, true, false>(GROKC_LINEAR_ARGS);
    } else {
        if (Q && zeros != nullptr)
            body<WF, ACT, OUT_F32, R, KS, WN, D, PF, NL, TR, IO, false, Q>(GROKC_LINEAR_ARGS);
        else
            body<WF, ACT, OUT_F32, R, KS, WN, D, PF, NL, TR, IO, false, false>(GROKC_LINEAR_ARGS);
    }
}

}  // namespace gemv2
}  // namespace grokc
