// `linear` for many rows of x (prefill) on sm_90a: warpgroup MMA (wgmma) fed from shared memory.
//
// Block tile BM = 64 * WGS rows of x by BN weight rows (128 or 256) by BK = 64; WGS warpgroups
// (128 threads each), warpgroup w computing rows 64w..64w+63 with BN / 128 wgmma.m64n128k16 per
// 16 k (f32 accumulators in registers, BN / 2 a thread). Both operands are K-major tiles in the
// 128-byte swizzle wgmma's descriptors name: row r of a tile is 128 bytes (64 k of f16), its
// 16-byte piece p at p ^ (r % 8), 8-row groups 1024 bytes apart, every tile 1024-byte aligned.
//
// Pipeline: STAGES slots of (x tile, weight tile as stored, norm slice) filled by cp.async
// (zero-filled past M, N, K), STAGES - 1 tiles in flight. Per tile kt: copy tile kt + STAGES - 1
// into the slot tile kt - 1 left, issue tile kt's wgmmas, convert tile kt + 1 while they run
// (barrier first: its copies have landed), wait for the wgmmas, barrier.
// Convert (int4): each 32-bit word of codes (8 k, artifacts/int4.py's pair order) becomes one
// 16-byte piece of f16 (e - 8, minus zero - 8 where there are zeros, times norm[k] with a norm)
// in one of two f16 weight buffers; an f16 weight tile is multiplied by the norm in place (no
// norm: read as copied). All threads copy, convert and issue MMAs: no producer warps, no TMA (the
// kernel ABI has plain pointers, no tensor maps).
//
// Prologue: RMSNorm's weight is folded into the weight tile (rounded to f16, as linear_gemm does)
// and two threads per row sum the squares of x from the staged tile; the rms factor multiplies
// the finished sums. Gated (silu_mul, gelu_tanh_mul): the first BN / 2 rows of the weight tile are
// gate rows, the rest the matching up rows, so a thread's accumulators j and j + BN / 4 hold the
// gate and up of one output. Epilogue: row scale (Q4), rms factor, addend, bias, activation,
// residual, f16/f32 store, straight from the accumulators (linear::finish).
//
// Dynamic shared memory (rules_linear.Wgmma.smem computes the same):
//   1024 (alignment) + STAGES * (BM*128 + (f16 ? BN*128 : BN*32) + 128) + (q4 ? 2*BN*128 : 0) + BM*4.
//
// Formats: F16 (K % 8 == 0) and Q4 per channel (K % 32 == 0); grouped int4 and int8 stay with
// linear_gemm / linear_ref (checked by the rule).
#pragma once

#include "linear_common.cuh"

namespace grokc {
namespace wgmma {

using namespace linear;

constexpr int BK = 64;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Byte offset of 16-byte piece p of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ int swz(int r, int p) { return r * 128 + ((p ^ (r & 7)) << 4); }

// Shared-memory matrix descriptor of a K-major 128B-swizzled tile at `addr`: start address >> 4
// (bits 0-13), leading byte offset 16 (unused by swizzled K-major layouts, bits 16-29), stride
// byte offset 1024 between 8-row groups (bits 32-45), base offset 0, swizzle mode 1 = 128B (bits 62-63).
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void mma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void mma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void mma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) before the async proxy (wgmma) reads them.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#define GROKC_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
// After the last wgmma.wait_group: keeps the compiler from reading the accumulators before it.
__device__ __forceinline__ void fence_acc(float d[64]) {
    asm volatile("" : GROKC_F8(0), GROKC_F8(8), GROKC_F8(16), GROKC_F8(24), GROKC_F8(32), GROKC_F8(40), GROKC_F8(48),
                 GROKC_F8(56)::"memory");
}
// d[64 x 128] += A[64 x 16] * B[128 x 16]^T, f16 operands from shared memory, f32 accumulators; d
// as the m64nNk16 D fragment: d[4j + 2h + e] = D[16 * warp + lane / 4 + 8h][8j + 2 * (lane % 4) + e].
__device__ __forceinline__ void mma_m64n128k16(float d[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : GROKC_F8(0), GROKC_F8(8), GROKC_F8(16), GROKC_F8(24), GROKC_F8(32), GROKC_F8(40), GROKC_F8(48), GROKC_F8(56)
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}
#undef GROKC_F8

template <int WF, int ACT, bool OUT_F32, int WGS, int BN, int STAGES, bool NORM, bool ZERO>
__device__ __forceinline__ void linear_wgmma_body(GROKC_LINEAR_PARAMS) {
    constexpr int BM = 64 * WGS, NT = 128 * WGS, NB = BN / 128;
    constexpr bool Q = WF == Q4;
    constexpr int X_BYTES = BM * 128, W_BYTES = BN * 128, RAW_BYTES = Q ? BN * 32 : W_BYTES;
    constexpr int X_PIECES = BM * 8 / NT, W_PIECES = (Q ? BN * 2 : BN * 8) / NT, WORDS = BN * 8 / NT;
    static_assert(BN % 128 == 0 && STAGES >= 3, "tile shape");
    static_assert(BN * 2 % NT == 0 && BN * 8 % NT == 0, "tile loads must split evenly");
    // [STAGES] x tiles | [STAGES] weight tiles as copied | [2] f16 weight tiles (q4) | [STAGES] norm slices | rstd [BM]
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* const xs = smem;
    unsigned char* const ws = xs + STAGES * X_BYTES;
    unsigned char* const wc = ws + STAGES * RAW_BYTES;
    unsigned char* const ns = wc + (Q ? 2 * W_BYTES : 0);
    float* const rstd = reinterpret_cast<float*>(ns + STAGES * 128);

    const int tid = threadIdx.x, m0 = blockIdx.y * BM;

    // Local weight-tile row -> weight row, or -1 past the end.
    auto wrow_of = [&](int i) -> int {
        if (ACT == NONE) {
            const int n = blockIdx.x * BN + i;
            return n < N ? n : -1;
        }
        const int c = blockIdx.x * (BN / 2) + i % (BN / 2);
        if (c >= N) return -1;
        return i < BN / 2 ? c : N + c;
    };

    const size_t w_row_bytes = Q ? static_cast<size_t>(K) / 2 : static_cast<size_t>(K) * 2;
    auto load_stage = [&](int st, int kt) {
        const int k0 = kt * BK;
        unsigned char* xt = xs + st * X_BYTES;
#pragma unroll
        for (int i = 0; i < X_PIECES; ++i) {
            const int idx = tid + i * NT, r = idx >> 3, p = idx & 7, k = k0 + p * 8;
            const bool ok = m0 + r < M && k < K;
            cp_async16(xt + swz(r, p), ok ? x + static_cast<size_t>(m0 + r) * K + k : x, ok);
        }
        unsigned char* wt = ws + st * RAW_BYTES;
#pragma unroll
        for (int i = 0; i < W_PIECES; ++i) {
            const int idx = tid + i * NT;
            const int r = Q ? idx >> 1 : idx >> 3, p = Q ? idx & 1 : idx & 7;
            const int k = k0 + (Q ? p * 32 : p * 8), wr = wrow_of(r);
            const bool ok = wr >= 0 && k < K;
            const size_t off = wr * w_row_bytes + (Q ? static_cast<size_t>(k) / 2 : static_cast<size_t>(k) * 2);
            cp_async16(wt + (Q ? r * 32 + p * 16 : swz(r, p)), static_cast<const unsigned char*>(weight) + (ok ? off : 0),
                       ok);
        }
        if (NORM && tid < 8) {
            const int k = k0 + tid * 8;
            const bool ok = k < K;
            cp_async16(ns + st * 128 + tid * 16, ok ? norm + k : x, ok);
        }
    };

    // zero - 8 of the weight rows this thread converts (the same rows in every tile)
    __half2 zd[WORDS];
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
        const int wr = wrow_of((tid + i * NT) >> 3);
        zd[i] = __float2half2_rn(0.f);
        if (Q && ZERO && wr >= 0) zd[i] = __half2half2(__hsub(zeros[wr], __float2half_rn(8.f)));
    }
    float ss = 0.f;  // NORM: sum of squares of x row tid / 2, k pieces 4 * (tid % 2) .. + 3 of each tile

    // The tile in slot st as wgmma reads it: int4 -> f16 into wc[buf], the norm folded in.
    auto convert = [&](int st, int buf) {
        const unsigned char* nrm = ns + st * 128;
        if (NORM) {
            const unsigned char* xt = xs + st * X_BYTES;
#pragma unroll
            for (int j = 0; j < 4; ++j) ss += sumsq8(lds16(xt + swz(tid >> 1, (tid & 1) * 4 + j)));
        }
        if (Q) {
            const unsigned char* raw = ws + st * RAW_BYTES;
            unsigned char* dst = wc + buf * W_BYTES;
#pragma unroll
            for (int i = 0; i < WORDS; ++i) {
                const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
                __half2 p[4];
                int4_word_to_h2(lds4(raw + r * 32 + c * 4), p);
                uint4 nv = make_uint4(0u, 0u, 0u, 0u);
                if (NORM) nv = lds16(nrm + c * 16);
                const uint32_t nw[4] = {nv.x, nv.y, nv.z, nv.w};
                uint32_t o[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (ZERO) p[j] = __hsub2(p[j], zd[i]);
                    if (NORM) p[j] = __hmul2(p[j], u32_as_h2(nw[j]));
                    o[j] = h2_as_u32(p[j]);
                }
                *reinterpret_cast<uint4*>(dst + swz(r, c)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        } else if (NORM) {
            unsigned char* wt = ws + st * RAW_BYTES;
#pragma unroll
            for (int i = 0; i < WORDS; ++i) {
                const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
                uint4* piece = reinterpret_cast<uint4*>(wt + swz(r, c));
                *piece = hmul8(*piece, lds16(nrm + c * 16));
            }
        }
    };

    float acc[NB * 64];
#pragma unroll
    for (int i = 0; i < NB * 64; ++i) acc[i] = 0.f;

    // ---- main loop: tile kt on the tensor cores while tile kt + 1 is converted ------------------
    const int nk = (K + BK - 1) / BK, wg = tid / 128;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, s);
        cp_async_commit();
    }
    // Tile t in shared memory as wgmma reads it, visible to every thread (barrier before: the tile's
    // copies have landed; barrier after: every thread's conversion is done).
    auto ready = [&](int t) {
        cp_async_wait<STAGES - 2>();
        fence_async_smem();
        if (Q || NORM) {
            __syncthreads();
            convert(t % STAGES, t & 1);
            fence_async_smem();
        }
    };
    ready(0);
    __syncthreads();
    for (int kt = 0; kt < nk; ++kt) {
        const int st = kt % STAGES, nxt = kt + STAGES - 1;
        if (nxt < nk) load_stage(nxt % STAGES, nxt);  // the slot of tile kt - 1, retired below
        cp_async_commit();
        const uint32_t xa = smem_u32(xs + st * X_BYTES) + wg * 64 * 128;
        const uint32_t wb = smem_u32(Q ? wc + (kt & 1) * W_BYTES : ws + st * RAW_BYTES);
        mma_fence();
#pragma unroll
        for (int j = 0; j < BK / 16; ++j)
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
                mma_m64n128k16(acc + 64 * nb, desc(xa + 32 * j), desc(wb + nb * 128 * 128 + 32 * j));
        mma_commit();
        if (kt + 1 < nk) ready(kt + 1);
        // wait_group 0, not 1: with an MMA group in flight across the loop's back edge ptxas
        // serialises every wgmma (C7515)
        mma_wait_all();
        __syncthreads();  // tile kt's slot and f16 buffer are free in every warpgroup
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) fence_acc(acc + 64 * nb);
    cp_async_wait<0>();

    // ---- rms factors -----------------------------------------------------------------------------
    if (NORM) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        if ((tid & 1) == 0) rstd[tid >> 1] = rsqrtf(ss / static_cast<float>(K) + eps);
        __syncthreads();
    }

    // ---- epilogue straight from the accumulators -------------------------------------------------
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rl = 64 * wg + 16 * ((tid >> 5) & 3) + g + 8 * h, m = m0 + rl;
        if (m >= M) continue;
        const float rs = NORM ? rstd[rl] : 1.f;
#pragma unroll
        for (int j = 0; j < (ACT != NONE ? BN / 16 : BN / 8); ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 8 * j + 2 * t + e;
                float gate = acc[4 * j + 2 * h + e], up = 0.f;
                int n;
                if (ACT == NONE) {
                    n = blockIdx.x * BN + c;
                    if (n >= N) continue;
                    if (Q) gate *= __half2float(scales[n]);
                } else {
                    n = blockIdx.x * (BN / 2) + c;
                    if (n >= N) continue;
                    up = acc[4 * (j + BN / 16) + 2 * h + e];
                    if (Q) {
                        gate *= __half2float(scales[n]);
                        up *= __half2float(scales[N + n]);
                    }
                }
                finish<ACT, OUT_F32>(out, residual, addend, bias, m, n, N, gate * rs, up * rs);
            }
    }
}

template <int WF, int ACT, bool OUT_F32, int WGS, int BN, int STAGES>
__device__ __forceinline__ void linear_wgmma(GROKC_LINEAR_PARAMS) {
    static_assert(WF == F16 || WF == Q4, "the wgmma family reads f16 and per-channel int4 weights");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const bool z = WF == Q4 && zeros != nullptr;
    if (norm != nullptr) {
        if (z)
            linear_wgmma_body<WF, ACT, OUT_F32, WGS, BN, STAGES, true, true>(GROKC_LINEAR_ARGS);
        else
            linear_wgmma_body<WF, ACT, OUT_F32, WGS, BN, STAGES, true, false>(GROKC_LINEAR_ARGS);
    } else {
        if (z)
            linear_wgmma_body<WF, ACT, OUT_F32, WGS, BN, STAGES, false, true>(GROKC_LINEAR_ARGS);
        else
            linear_wgmma_body<WF, ACT, OUT_F32, WGS, BN, STAGES, false, false>(GROKC_LINEAR_ARGS);
    }
#else
    __trap();  // wgmma exists on sm_90a only; the rule picks this family for that target alone
#endif
}

}  // namespace wgmma
}  // namespace grokc
