// `linear` for many rows of x (prefill, M = bucket length): a tensor-core GEMM.
//
// Block tile BM x BN (weight rows) x BK = 64, WM x WN warps, each warp a (BM/WM) x (BN/WN) tile
// of mma.m16n8k16 (f32 accumulators). x and the weight tiles stream through STAGES shared-memory
// buffers with cp.async (zero-filled past M, N, K). Fragments are plain 16-byte / 4-byte shared
// loads: lane (g, q) = (lane/4, lane%4) owns 8 consecutive k (8q..8q+7 of each 32-k half of the
// tile) for A rows g, g+8 and for weight row g, and MMA t uses k 8q+4t..8q+4t+3 of every lane --
// for int4 that is the pair order of the magic-number conversion, so a weight word goes from
// shared memory to B fragments with one lop3 and one hsub2 per pair. XOR swizzles keep the
// fragment loads free of bank conflicts.
//
// Prologue: RMSNorm's weight is folded into the B fragments (B * norm[k]) and each row's sum of
// squares is gathered from the A fragments, so x itself is copied untouched; the rms factor
// multiplies the finished sums. gated (silu_mul, gelu_tanh_mul): each warp's column tile is half gate rows, half the
// matching up rows, so gate and up meet in the same thread. Epilogue: row scale (Q4), rms
// factor, the gated activation, residual, f16/f32 store, straight from the accumulators.
//
// Dynamic shared memory (rules_linear.gemm_smem computes the same):
//   STAGES * (BM*BK*2 + (f16 ? BN*BK*2 : BN*BK/2) + BK*2)  +  BM * 4.
//
// Requirements (checked by the rule): f16: K % 8 == 0; int4: K % 32 == 0, and for Q4G
// group_size % 32 == 0.
#pragma once

#include "linear_common.cuh"

namespace grokc {
namespace gemm {

using namespace linear;

constexpr int BK = 64;

// 128-byte rows of 8 pieces (x, f16 weights, norm): piece p of row r lives at p ^ 4*(r & 1).
__device__ __forceinline__ int swz8(int r, int p) { return p ^ ((r & 1) << 2); }
// 32-byte rows of 2 pieces (int4 weights): piece j of row r lives at j ^ ((r >> 2) & 1).
__device__ __forceinline__ int swz2(int r, int j) { return j ^ ((r >> 2) & 1); }

// block_m0 >= 0: the block's first row of x (a grouped GEMM places its tiles itself, moe.cuh);
// else blockIdx.y * BM.
template <int WF, int ACT, bool OUT_F32, int BM, int BN, int WM, int WN, int STAGES, bool NORM, bool ZERO>
__device__ __forceinline__ void linear_gemm_body(GROKC_LINEAR_PARAMS, int block_m0 = -1) {
    constexpr int NT = 32 * WM * WN;
    constexpr int TM = BM / WM, TN = BN / WN;  // warp tile
    constexpr int MT = TM / 16, NTL = TN / 8;  // MMA tiles per warp
    static_assert(TM % 16 == 0 && TN % 8 == 0, "warp tile must be a multiple of 16 x 8");
    static_assert(ACT == NONE || NTL % 2 == 0, "gated activations need an even number of n tiles per warp");
    constexpr int A_BYTES = BM * BK * 2;
    constexpr int B_ROW = (WF == F16) ? BK * 2 : BK / 2;  // bytes per weight row per tile
    constexpr int B_BYTES = BN * B_ROW;
    constexpr int NRM_BYTES = BK * 2;
    constexpr int STAGE_BYTES = A_BYTES + B_BYTES + NRM_BYTES;
    constexpr int A_PIECES = BM * 8 / NT, B_PIECES = BN * (B_ROW / 16) / NT;
    static_assert(BM * 8 % NT == 0 && BN * (B_ROW / 16) % NT == 0, "tile loads must split evenly");
    extern __shared__ __align__(16) unsigned char smem[];
    float* rstd = reinterpret_cast<float*>(smem + STAGES * STAGE_BYTES);  // [BM]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, q = lane & 3;
    const int m0 = block_m0 >= 0 ? block_m0 : blockIdx.y * BM;
    const bool has_norm = NORM, has_zero = ZERO;
    const int G = (WF == Q4G) ? (K + group_size - 1) / group_size : 1;

    // Local weight-tile row -> weight row, or -1 past the end.
    auto wrow_of = [&](int i) -> int {
        if (ACT == NONE) {
            const int n = blockIdx.x * BN + i;
            return n < N ? n : -1;
        }
        const int w = i % TN;
        const int c = blockIdx.x * (BN / 2) + (i / TN) * (TN / 2) + (w % (TN / 2));
        if (c >= N) return -1;
        return w < TN / 2 ? c : N + c;
    };

    // ---- one stage of copies: thread tid copies pieces tid, tid + NT, ... of each tile ---------
    const size_t w_row_bytes = (WF == F16) ? static_cast<size_t>(K) * 2 : static_cast<size_t>(K) / 2;
    auto load_stage = [&](int st, int kt) {
        unsigned char* base = smem + st * STAGE_BYTES;
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < A_PIECES; ++i) {
            const int idx = tid + i * NT, r = idx >> 3, p = idx & 7, k = k0 + p * 8;
            const bool ok = m0 + r < M && k < K;
            cp_async16(base + r * 128 + swz8(r, p) * 16, ok ? x + static_cast<size_t>(m0 + r) * K + k : x, ok);
        }
#pragma unroll
        for (int i = 0; i < B_PIECES; ++i) {
            const int idx = tid + i * NT;
            const int r = (WF == F16) ? idx >> 3 : idx >> 1, p = (WF == F16) ? idx & 7 : idx & 1;
            const int k = k0 + ((WF == F16) ? p * 8 : p * 32);
            const int wr = wrow_of(r);
            const bool ok = wr >= 0 && k < K;
            const size_t off = wr * w_row_bytes + ((WF == F16) ? static_cast<size_t>(k) * 2 : static_cast<size_t>(k) / 2);
            const int dst = (WF == F16) ? r * 128 + swz8(r, p) * 16 : r * 32 + swz2(r, p) * 16;
            cp_async16(base + A_BYTES + dst, static_cast<const unsigned char*>(weight) + (ok ? off : 0), ok);
        }
        if (NORM && tid < 8) {
            const int k = k0 + tid * 8;
            const bool ok = k < K;
            cp_async16(base + A_BYTES + B_BYTES + tid * 16, ok ? norm + k : x, ok);
        }
    };

    // ---- per-thread constants of the B fragments -----------------------------------------------
    int brow[NTL];  // weight row of this lane's B fragments, per n tile (-1: none)
    __half2 zd[NTL];
#pragma unroll
    for (int nt = 0; nt < NTL; ++nt) {
        brow[nt] = wrow_of(wn * TN + nt * 8 + g);
        zd[nt] = __float2half2_rn(0.f);
        if (WF == Q4 && has_zero && brow[nt] >= 0)
            zd[nt] = __half2half2(__hsub(zeros[brow[nt]], __float2half_rn(8.f)));
    }

    float acc[MT][NTL][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[mt][nt][j] = 0.f;
    float ss[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ss[mt][0] = ss[mt][1] = 0.f;

    auto compute = [&](int st, int kt) {
        const unsigned char* A = smem + st * STAGE_BYTES;
        const unsigned char* B = A + A_BYTES;
        const unsigned char* NRM = B + B_BYTES;
        // Q4G: scale and -(z-8)*scale of each n tile's row for both 32-k halves of the tile.
        __half2 gsc[NTL][2], gzs[NTL][2];
        if (WF == Q4G) {
#pragma unroll
            for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    const int k = kt * BK + kk * 32 + q * 8;
                    __half2 sc = __float2half2_rn(0.f), zs = __float2half2_rn(0.f);
                    if (brow[nt] >= 0 && k < K) {
                        const size_t gi = static_cast<size_t>(brow[nt]) * G + k / group_size;
                        const __half s1 = scales[gi];
                        sc = __half2half2(s1);
                        if (has_zero) zs = __half2half2(__hneg(__hmul(__hsub(zeros[gi], __float2half_rn(8.f)), s1)));
                    }
                    gsc[nt][kk] = sc;
                    gzs[nt][kk] = zs;
                }
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            const int piece = kk * 4 + q;  // this lane's 8 k within the 64-k tile
            uint32_t bf[NTL][4];
            uint4 nv = make_uint4(0u, 0u, 0u, 0u);
            if (has_norm) nv = lds16(NRM + piece * 16);
            const uint32_t nrm[4] = {nv.x, nv.y, nv.z, nv.w};
#pragma unroll
            for (int nt = 0; nt < NTL; ++nt) {
                const int r = wn * TN + nt * 8 + g;
                __half2 p[4];
                if (WF == F16) {
                    const uint4 v = lds16(B + r * 128 + swz8(r, piece) * 16);
                    p[0] = u32_as_h2(v.x);
                    p[1] = u32_as_h2(v.y);
                    p[2] = u32_as_h2(v.z);
                    p[3] = u32_as_h2(v.w);
                } else {
                    int4_word_to_h2(lds4(B + r * 32 + swz2(r, kk) * 16 + q * 4), p);
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        if (WF == Q4 && has_zero) p[j] = __hsub2(p[j], zd[nt]);
                        if (WF == Q4G) p[j] = __hfma2(p[j], gsc[nt][kk], gzs[nt][kk]);
                    }
                }
                if (has_norm) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) p[j] = __hmul2(p[j], u32_as_h2(nrm[j]));
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) bf[nt][j] = h2_as_u32(p[j]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = wm * TM + mt * 16 + g;
                const uint4 lo = lds16(A + r * 128 + swz8(r, piece) * 16);
                const uint4 hi = lds16(A + (r + 8) * 128 + swz8(r + 8, piece) * 16);
                if (has_norm && mt % WN == wn) {  // one warp per row gathers the sum of squares
                    ss[mt][0] += sumsq8(lo);
                    ss[mt][1] += sumsq8(hi);
                }
                const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
                const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
                for (int nt = 0; nt < NTL; ++nt) {
                    const uint32_t b0[2] = {bf[nt][0], bf[nt][1]}, b1[2] = {bf[nt][2], bf[nt][3]};
                    mma_16816(acc[mt][nt], a0, b0);
                    mma_16816(acc[mt][nt], a1, b1);
                }
            }
        }
    };

    // ---- main loop: STAGES-1 tiles in flight ---------------------------------------------------
    const int nk = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int nxt = kt + STAGES - 1;
        if (nxt < nk) load_stage(nxt % STAGES, nxt);
        cp_async_commit();
        compute(kt % STAGES, kt);
    }
    cp_async_wait<0>();

    // ---- rms factors -----------------------------------------------------------------------------
    if (has_norm) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if (mt % WN != wn) continue;  // warp-uniform
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = ss[mt][h];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                if (q == 0) rstd[wm * TM + mt * 16 + g + 8 * h] = rsqrtf(v / static_cast<float>(K) + eps);
            }
        }
        __syncthreads();
    }

    // ---- epilogue straight from the accumulators -------------------------------------------------
    constexpr int NTQ = ACT != NONE ? NTL / 2 : NTL;  // n tiles of outputs (gated: the gate half)
    const int n0 = (ACT != NONE ? blockIdx.x * (BN / 2) + wn * (TN / 2) : blockIdx.x * BN + wn * TN) + 2 * q;
    finish_pairs<ACT, OUT_F32, WF == Q4, MT * 2 * NTQ>(out, residual, addend, bias, scales, M, N, [&](int p) {
        const int mt = p / (2 * NTQ), h = (p / NTQ) % 2, nt = p % NTQ, rl = wm * TM + mt * 16 + g + 8 * h;
        return OutPair{m0 + rl, n0 + nt * 8, has_norm ? rstd[rl] : 1.f, acc[mt][nt] + 2 * h,
                       acc[mt][nt + (ACT != NONE ? NTL / 2 : 0)] + 2 * h};
    });
}

template <int WF, int ACT, bool OUT_F32, int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void linear_gemm(GROKC_LINEAR_PARAMS) {
    static_assert(WF == F16 || WF == Q4 || WF == Q4G, "the gemm family reads f16 and int4 weights");
    const bool z = WF != F16 && zeros != nullptr;
    if (norm != nullptr) {
        if (z)
            linear_gemm_body<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, true, true>(GROKC_LINEAR_ARGS);
        else
            linear_gemm_body<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, true, false>(GROKC_LINEAR_ARGS);
    } else {
        if (z)
            linear_gemm_body<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, false, true>(GROKC_LINEAR_ARGS);
        else
            linear_gemm_body<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, false, false>(GROKC_LINEAR_ARGS);
    }
}

}  // namespace gemm
}  // namespace grokc
