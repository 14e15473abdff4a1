// `linear` for few rows of x (decode: M = batch slots <= 16): a weight-streaming GEMV on tensor
// cores.
//
// Work split. A block owns BR = 8*RG weight rows (gated: BR/2 gate rows and the matching up
// rows) and runs KS*RG warps: warp (rg, ks) streams the 8 rows of row group rg over the K steps
// ks, ks+KS, ... (intra-block split-K), U steps per round, the next round's loads in flight while
// the current one is computed. Partial sums meet in shared memory, where the epilogue (row
// scale, rms factor, the gated activation, residual, f16/f32 store) runs.
//
// One step = 4 chunks of 16 bytes per weight row: 128 k for int4 (chunk = 32 codes), 32 k for
// f16 (chunk = 8 halves). Lane (g, q) = (lane/4, lane%4) loads chunk q of row g, so a warp load
// covers 64 contiguous bytes of 8 rows. The chunk is fed to mma.m16n8k16 as the B operand
// (n = weight row, 16 rows of x as A): the 16 logical k of one MMA are 4 consecutive k from each
// lane q's chunk (mma t of the chunk uses k = 4t..4t+3), which is exactly the pair order the
// int4 magic-number conversion produces, and A is read with the same permutation. Rows of x
// past M are zero in A; their results are never stored.
//
// x is staged once per block in shared memory by cp.async, in slabs of whole rounds that fit
// X_BUDGET bytes, its 16-byte pieces XOR-swizzled so the A reads are free of bank conflicts. With
// a norm, the staged x is multiplied by `norm` in place and the sum of squares gathered on the
// way; the rms factor multiplies the finished sums. Dynamic shared memory (Gemv.smem in
// rules_linear.py computes the same):
//   M * slab_k * 2 (x)  +  slab_k * 2 (norm)  +  KS * M * BR * 4 (partials)  +  M * 4 (sums of squares).
//
// Requirements (checked by the rule): 1 <= M <= MT (8 or 16); f16: K % 8 == 0; int4: K % 32 == 0, and for
// Q4G group_size % 32 == 0.
#pragma once

#include "linear_common.cuh"

namespace grokc {
namespace gemv {

using namespace linear;

constexpr int X_BUDGET = 64 * 1024;  // bytes of staged x per block (rules_linear.GEMV_X_BUDGET)

// Physical 16-byte piece of logical piece p in staged row m (rows are a multiple of 8 pieces).
__device__ __forceinline__ int swz(int m, int p) { return p ^ (((p >> 2) & 3) ^ ((m & 1) << 2)); }

template <int WF, int ACT, bool OUT_F32, int MT, int KS, int RG, int U, bool ZERO>
__device__ __forceinline__ void linear_gemv_body(GROKC_LINEAR_PARAMS) {
    constexpr int NT = 32 * KS * RG;
    constexpr int BR = 8 * RG;                // weight rows per block
    constexpr int CK = (WF == F16) ? 8 : 32;  // k per 16-byte chunk
    constexpr int STEP_K = 4 * CK;
    constexpr int ROUND_K = STEP_K * KS * U;  // k consumed by the block per round
    extern __shared__ __align__(16) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ks = warp % KS, rg = warp / KS;
    const int g = lane >> 2, q = lane & 3;

    const int nsteps = (K + STEP_K - 1) / STEP_K;
    const int nrounds = (nsteps + KS * U - 1) / (KS * U);
    const int rps = max(1, X_BUDGET / (M * ROUND_K * 2));  // rounds per staged slab
    const int slab_k = min(rps, nrounds) * ROUND_K;        // staged halves per row of x

    __half* xs = reinterpret_cast<__half*>(smem);
    __half* ns = xs + static_cast<size_t>(M) * slab_k;                      // [slab_k] norm
    float* red = reinterpret_cast<float*>(ns + slab_k);                     // [KS][M][BR] partials
    float* ssq = red + KS * M * BR;                                         // [M] sums of squares

    // The weight row this lane streams.
    const int lrow = 8 * rg + g;
    int wrow;
    bool row_ok;
    if (ACT != NONE) {
        constexpr int H = BR / 2;
        const int col = blockIdx.x * H + (lrow % H);
        row_ok = col < N;
        wrow = lrow < H ? col : N + col;
    } else {
        wrow = blockIdx.x * BR + lrow;
        row_ok = wrow < N;
    }
    const size_t row_bytes = (WF == F16) ? static_cast<size_t>(K) * 2 : static_cast<size_t>(K) / 2;
    const unsigned char* wp = static_cast<const unsigned char*>(weight) + (row_ok ? wrow * row_bytes : 0);
    const bool has_zero = ZERO;
    const int G = (WF == Q4G) ? (K + group_size - 1) / group_size : 1;
    const __half2 H2ZERO = __float2half2_rn(0.f);
    __half2 zd2 = H2ZERO;  // Q4: (zero - 8) of this row
    if (WF == Q4 && has_zero && row_ok) zd2 = __half2half2(__hsub(zeros[wrow], __float2half_rn(8.f)));

    // ---- one round of weight loads: U chunks (and Q4G: their group scale and -(z-8)*scale) ----
    auto load_round = [&](uint4* buf, __half2* gsc, __half2* gzs, int r) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = (r * U + u) * KS + ks;
            const int k = s * STEP_K + q * CK;
            const bool ok = row_ok && k < K;
            buf[u] = ok ? ldg_stream(wp + (WF == F16 ? static_cast<size_t>(k) * 2 : static_cast<size_t>(k) / 2))
                        : make_uint4(0u, 0u, 0u, 0u);
            if (WF == Q4G) {
                __half2 sc = H2ZERO, zs = H2ZERO;
                if (ok) {
                    const size_t gi = static_cast<size_t>(wrow) * G + k / group_size;
                    const __half s1 = scales[gi];
                    sc = __half2half2(s1);
                    if (has_zero) zs = __half2half2(__hneg(__hmul(__hsub(zeros[gi], __float2half_rn(8.f)), s1)));
                }
                gsc[u] = sc;
                gzs[u] = zs;
            }
        }
    };

    // ---- stage x[:, k0 : k0 + slab_k) into xs with cp.async (zero past K); with a norm, each
    // thread then scales the pieces it copied by norm and adds their squares to ssq ----------------
    auto stage = [&](int k0) {
        const int P = slab_k / 8;
        const int total = M * P;
        for (int idx = tid; idx < total; idx += NT) {
            const int m = idx / P, p = idx - m * P, k = k0 + p * 8;
            const bool ok = k < K;
            cp_async16(xs + static_cast<size_t>(m) * slab_k + swz(m, p) * 8, ok ? x + static_cast<size_t>(m) * K + k : x, ok);
        }
        if (norm != nullptr) {
            for (int p = tid; p < P; p += NT) {
                const int k = k0 + p * 8;
                cp_async16(ns + p * 8, k < K ? norm + k : norm, k < K);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        if (norm == nullptr) return;
        __syncthreads();  // norm slab complete (and, on the first slab, ssq zeroed)
        for (int base = 0; base < total; base += NT) {  // block-uniform trip count: shuffles are safe
            const int idx = base + tid;
            const bool in = idx < total;
            const int m = in ? idx / P : M - 1, p = in ? idx - m * P : 0;
            float ss = 0.f;
            if (in) {
                __half* at = xs + static_cast<size_t>(m) * slab_k + swz(m, p) * 8;
                uint4 v = lds16(at);
                ss = sumsq8(v);
                *reinterpret_cast<uint4*>(at) = hmul8(v, lds16(ns + p * 8));
            }
            const int m0 = __shfl_sync(0xffffffffu, m, 0);
            if (__all_sync(0xffffffffu, m == m0)) {
                ss = warp_sum(ss);
                if (lane == 0) atomicAdd(&ssq[m0], ss);
            } else if (ss != 0.f) {
                atomicAdd(&ssq[m], ss);
            }
        }
    };

    // ---- MMAs for one round; k0 = first k of the staged slab ----------------------------------
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const __half* xrow_lo = xs + static_cast<size_t>(g) * slab_k;
    const __half* xrow_hi = xs + static_cast<size_t>(g + 8) * slab_k;
    const bool lo_ok = g < M, hi_ok = MT == 16 && g + 8 < M;
    auto compute_round = [&](const uint4* buf, const __half2* gsc, const __half2* gzs, int r, int k0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = (r * U + u) * KS + ks;
            if (s >= nsteps) continue;  // warp-uniform
            const int p0 = (s * STEP_K + q * CK - k0) >> 3;  // first x piece of this lane's chunk
            const uint32_t w[4] = {buf[u].x, buf[u].y, buf[u].z, buf[u].w};
            if (WF == F16) {
                const uint4 xa = lo_ok ? lds16(xrow_lo + swz(g, p0) * 8) : make_uint4(0u, 0u, 0u, 0u);
                const uint4 xb = hi_ok ? lds16(xrow_hi + swz(g + 8, p0) * 8) : make_uint4(0u, 0u, 0u, 0u);
                const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y}, b0[2] = {w[0], w[1]};
                const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w}, b1[2] = {w[2], w[3]};
                mma_16816(acc, a0, b0);
                mma_16816(acc, a1, b1);
            } else {
#pragma unroll
                for (int wi = 0; wi < 4; ++wi) {
                    const uint4 xa = lo_ok ? lds16(xrow_lo + swz(g, p0 + wi) * 8) : make_uint4(0u, 0u, 0u, 0u);
                    const uint4 xb = hi_ok ? lds16(xrow_hi + swz(g + 8, p0 + wi) * 8) : make_uint4(0u, 0u, 0u, 0u);
                    __half2 p[4];
                    int4_word_to_h2(w[wi], p);
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        if (WF == Q4 && has_zero) p[j] = __hsub2(p[j], zd2);
                        if (WF == Q4G) p[j] = __hfma2(p[j], gsc[u], gzs[u]);
                    }
                    const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y}, b0[2] = {h2_as_u32(p[0]), h2_as_u32(p[1])};
                    const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w}, b1[2] = {h2_as_u32(p[2]), h2_as_u32(p[3])};
                    mma_16816(acc, a0, b0);
                    mma_16816(acc, a1, b1);
                }
            }
        }
    };

    // ---- main loop: loads of round r+1 are in flight while round r is computed ----------------
    uint4 cur[U], nxt[U];
    __half2 csc[U], czs[U], nsc[U], nzs[U];
    load_round(cur, csc, czs, 0);
    if (tid < M) ssq[tid] = 0.f;
    stage(0);
    __syncthreads();
    for (int r = 0; r < nrounds; ++r) {
        if (r + 1 < nrounds) load_round(nxt, nsc, nzs, r + 1);
        if (r > 0 && r % rps == 0) {  // next slab of x
            __syncthreads();
            stage(r * ROUND_K);
            __syncthreads();
        }
        compute_round(cur, csc, czs, r, (r / rps) * rps * ROUND_K);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            cur[u] = nxt[u];
            csc[u] = nsc[u];
            czs[u] = nzs[u];
        }
    }

    // ---- partial sums -> shared, then the epilogue ---------------------------------------------
    const int n_lo = 8 * rg + 2 * q;
    if (lo_ok) {
        red[(ks * M + g) * BR + n_lo] = acc[0];
        red[(ks * M + g) * BR + n_lo + 1] = acc[1];
    }
    if (hi_ok) {
        red[(ks * M + g + 8) * BR + n_lo] = acc[2];
        red[(ks * M + g + 8) * BR + n_lo + 1] = acc[3];
    }
    __syncthreads();

    constexpr int OC = (ACT != NONE) ? BR / 2 : BR;  // output columns per block
    for (int e = tid; e < M * OC; e += NT) {
        const int m = e / OC, j = e - m * OC;
        const int n = blockIdx.x * OC + j;
        if (n >= N) continue;
        const float rs = norm != nullptr ? rsqrtf(ssq[m] / static_cast<float>(K) + eps) : 1.f;
        float gate = 0.f, up = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            gate += red[(kk * M + m) * BR + j];
            if (ACT != NONE) up += red[(kk * M + m) * BR + j + OC];
        }
        if (WF == Q4) {
            gate *= __half2float(scales[n]);
            if (ACT != NONE) up *= __half2float(scales[N + n]);
        }
        finish<ACT, OUT_F32>(out, residual, addend, bias, m, n, N, gate * rs, up * rs);
    }
}

// MT: rows of x per MMA (8 when M <= 8: the upper half of A is known to be zero).
template <int WF, int ACT, bool OUT_F32, int MT, int KS, int RG, int U>
__device__ __forceinline__ void linear_gemv(GROKC_LINEAR_PARAMS) {
    static_assert(MT == 8 || MT == 16, "MT is 8 or 16");
    static_assert(WF == F16 || WF == Q4 || WF == Q4G, "the gemv family reads f16 and int4 weights");
    if (WF != F16 && zeros != nullptr)
        linear_gemv_body<WF, ACT, OUT_F32, MT, KS, RG, U, true>(GROKC_LINEAR_ARGS);
    else
        linear_gemv_body<WF, ACT, OUT_F32, MT, KS, RG, U, false>(GROKC_LINEAR_ARGS);
}

}  // namespace gemv
}  // namespace grokc
