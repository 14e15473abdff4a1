// `linear` for many rows of x (prefill) on sm_90a: warpgroup MMA (wgmma) fed from shared memory.
//
// Block tile BM = 64 * WGS rows of x by BN weight rows (128 or 256) by BK = 64. WGS consumer
// warpgroups, warpgroup w computing rows 64w..64w+63 with one wgmma.m64n<BN>k16 per 16 k (f32
// accumulators in registers, BN / 2 a thread), and one producer warpgroup after them. Both operands
// are K-major tiles in the 128-byte swizzle wgmma's descriptors name: row r of a tile is 128 bytes
// (64 k of f16), its 16-byte piece p at p ^ (r % 8), 8-row groups 1024 bytes apart, every tile
// 1024-byte aligned.
//
// Pipeline: STAGES slots of (x tile, weight tile as stored, norm slice), two mbarriers each. The
// producer warpgroup only copies: cp.async (zero-filled past M, N, K; `full` when a thread's copies
// have landed), STAGES - 1 tiles ahead, refilling a slot once the consumers mark it `empty`. The
// consumer warpgroups wait for `full`, convert the weight tile (int4: each 32-bit word of codes, 8 k
// in abi/int4.py's pair order, becomes one 16-byte piece of f16: e - 8, minus zero - 8 where
// there are zeros, times norm[k] with a norm, into f16 tile kt % 3; f16 with a norm: multiplied in
// place), meet at a named barrier, issue tile kt's wgmmas, sum squares of x meanwhile, wait for tile
// kt - 1's (wait_group 1: the tensor cores always have a tile queued, and converting tile kt
// overlaps tile kt - 1's wgmmas) and mark that slot `empty`. Buffer kt % 3 last held tile kt - 3,
// whose wgmmas both warpgroups waited for before the previous tile's barrier. The accumulators are
// not zeroed: the first wgmma overwrites them (zeroing them in registers, like any non-wgmma write
// of an accumulator while a group is in flight, makes ptxas serialise every wgmma: C7515).
// Converting in the consumers, not the producer: on the H200 the producer's conversions bounded the
// pipeline (gate_up at M = 512: 146 us with them, 97 without; the copies alone took 139).
// No TMA: the kernel ABI has plain pointers, no tensor maps.
//
// Prologue: RMSNorm's weight is folded into the weight tile (rounded to f16, as linear_gemm does)
// and two consumer threads per row sum the squares of x from the staged tile; the rms factor
// multiplies the finished sums. Gated (silu_mul, gelu_tanh_mul): the first BN / 2 rows of the weight
// tile are gate rows, the rest the matching up rows, so a thread's accumulators j and j + BN / 16
// hold the gate and up of one output. Epilogue: linear::finish_pairs straight from the accumulators
// (row scale, rms factor, addend, bias, activation, residual, f16/f32 store).
//
// Threads 128 * (WGS + 1); with two consumer warpgroups, setmaxnreg gives them 192 registers and the
// producer 120. Dynamic shared memory (rules_linear.Wgmma.smem computes the same):
//   1024 (alignment) + STAGES * (BM*128 + (f16 ? BN*128 : BN*32) + 128 + 16) + (q4 ? 3*BN*128 : 0) + BM*4.
//
// Measured (H200, bench/kernels_linear.py --sections prefill, 2026-12-03): 106-498 TFLOP/s,
// 0.18-0.74x of torch's fp16 F.linear on the Llama-3.2-1B / Llama-3-8B projections at M =
// 512..4096 (docs/kernels-linear.md, "wgmma GEMM": where the rest of the time goes).
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
__device__ __forceinline__ void mma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
__device__ __forceinline__ void mma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) before the async proxy (wgmma) reads them.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#define GROKC_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define GROKC_F64(i) GROKC_F8(i), GROKC_F8(i + 8), GROKC_F8(i + 16), GROKC_F8(i + 24), GROKC_F8(i + 32), \
                     GROKC_F8(i + 40), GROKC_F8(i + 48), GROKC_F8(i + 56)
// After the last wgmma.wait_group: keeps the compiler from reading the accumulators before it.
__device__ __forceinline__ void fence_acc(float d[64]) { asm volatile("" : GROKC_F64(0)::"memory"); }
// d[64 x N] (+)= A[64 x 16] * B[N x 16]^T, f16 operands from shared memory, f32 accumulators (added
// to when `accumulate`, else overwritten); d as the m64nNk16 D fragment:
// d[4j + 2h + e] = D[16 * warp + lane / 4 + 8h][8j + 2 * (lane % 4) + e].
template <int N>
__device__ __forceinline__ void mma_m64nNk16(float* d, uint64_t da, uint64_t db, int accumulate);
template <>
__device__ __forceinline__ void mma_m64nNk16<128>(float* d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : GROKC_F64(0)
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
}
template <>
__device__ __forceinline__ void mma_m64nNk16<256>(float* d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : GROKC_F64(0), GROKC_F64(64)
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
}
#undef GROKC_F64
#undef GROKC_F8

// ---- mbarriers (shared memory, CTA scope) ------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Arrives once this thread's earlier cp.async copies have landed (the count the barrier expects).
__device__ __forceinline__ void mbar_arrive_copies(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed (use j of a barrier: parity j % 2).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
}

template <int WF, int ACT, bool OUT_F32, int WGS, int BN, int STAGES, bool NORM, bool ZERO>
__device__ __forceinline__ void linear_wgmma_body(GROKC_LINEAR_PARAMS) {
    constexpr int BM = 64 * WGS, NC = 128 * WGS;  // NC consumer threads, then the producer warpgroup
    constexpr bool Q = WF == Q4;
    constexpr int X_BYTES = BM * 128, W_BYTES = BN * 128, RAW_BYTES = Q ? BN * 32 : W_BYTES;
    constexpr int X_PIECES = BM * 8 / 128, W_PIECES = (Q ? BN * 2 : BN * 8) / 128, WORDS = BN * 8 / NC;
    constexpr bool CONVERT = Q || NORM;  // the consumers rewrite the weight tile before their wgmmas read it
    static_assert(BN % 128 == 0 && STAGES >= 3, "tile shape");
    // [STAGES] x tiles | [STAGES] weight tiles as copied | [3] f16 weight tiles (q4) | [STAGES] norm slices |
    // mbarriers full, empty [STAGES] each | rstd [BM]
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* const xs = smem;
    unsigned char* const ws = xs + STAGES * X_BYTES;
    unsigned char* const wc = ws + STAGES * RAW_BYTES;
    unsigned char* const ns = wc + (Q ? 3 * W_BYTES : 0);
    uint64_t* const full = reinterpret_cast<uint64_t*>(ns + STAGES * 128);  // the slot's copies have landed
    uint64_t* const empty = full + STAGES;                                  // its wgmmas are done
    float* const rstd = reinterpret_cast<float*>(empty + STAGES);

    const int tid = threadIdx.x, m0 = blockIdx.y * BM, nk = (K + BK - 1) / BK;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + s, 128);
            mbar_init(empty + s, NC / 32);  // one arrival per consumer warp
        }
    }
    __syncthreads();

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

    if (tid >= NC) {  // ---- producer warpgroup: copies ----------------------------------------------
        if (WGS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 120;");
        const int p = tid - NC;
        const size_t w_row_bytes = Q ? static_cast<size_t>(K) / 2 : static_cast<size_t>(K) * 2;
        auto load_stage = [&](int st, int kt) {
            const int k0 = kt * BK;
            unsigned char* xt = xs + st * X_BYTES;
#pragma unroll
            for (int i = 0; i < X_PIECES; ++i) {
                const int idx = p + i * 128, r = idx >> 3, q = idx & 7, k = k0 + q * 8;
                const bool ok = m0 + r < M && k < K;
                cp_async16(xt + swz(r, q), ok ? x + static_cast<size_t>(m0 + r) * K + k : x, ok);
            }
            unsigned char* wt = ws + st * RAW_BYTES;
#pragma unroll
            for (int i = 0; i < W_PIECES; ++i) {
                const int idx = p + i * 128;
                const int r = Q ? idx >> 1 : idx >> 3, q = Q ? idx & 1 : idx & 7;
                const int k = k0 + (Q ? q * 32 : q * 8), wr = wrow_of(r);
                const bool ok = wr >= 0 && k < K;
                const size_t off = wr * w_row_bytes + (Q ? static_cast<size_t>(k) / 2 : static_cast<size_t>(k) * 2);
                cp_async16(wt + (Q ? r * 32 + q * 16 : swz(r, q)),
                           static_cast<const unsigned char*>(weight) + (ok ? off : 0), ok);
            }
            if (NORM && p < 8) {
                const int k = k0 + p * 8;
                const bool ok = k < K;
                cp_async16(ns + st * 128 + p * 16, ok ? norm + k : x, ok);
            }
            mbar_arrive_copies(full + st);
        };
        for (int s = 0; s < STAGES - 1 && s < nk; ++s) load_stage(s, s);
        for (int kt = 0; kt + STAGES - 1 < nk; ++kt) {  // tile kt + STAGES - 1 into tile kt - 1's slot
            if (kt >= 1) mbar_wait(empty + (kt - 1) % STAGES, ((kt - 1) / STAGES) & 1);
            load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        }
        return;
    }

    // ---- consumer warpgroups: conversion, wgmma, the sums of squares, the epilogue -------------------
    if (WGS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 192;");
    const int wg = tid / 128;
    // zero - 8 of the weight rows this thread converts (the same rows in every tile)
    __half2 zd[WORDS];
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
        const int wr = wrow_of((tid + i * NC) >> 3);
        zd[i] = __float2half2_rn(0.f);
        if (Q && ZERO && wr >= 0) zd[i] = __half2half2(__hsub(zeros[wr], __float2half_rn(8.f)));
    }
    // The weight tile in slot st as wgmma reads it: int4 -> f16 into wc[buf], the norm folded in.
    auto convert = [&](int st, int buf) {
        const unsigned char* nrm = ns + st * 128;
        if (Q) {
            const unsigned char* raw = ws + st * RAW_BYTES;
            unsigned char* dst = wc + buf * W_BYTES;
#pragma unroll
            for (int i = 0; i < WORDS; ++i) {
                const int idx = tid + i * NC, r = idx >> 3, c = idx & 7;
                __half2 h[4];
                int4_word_to_h2(lds4(raw + r * 32 + c * 4), h);
                uint4 nv = make_uint4(0u, 0u, 0u, 0u);
                if (NORM) nv = lds16(nrm + c * 16);
                const uint32_t nw[4] = {nv.x, nv.y, nv.z, nv.w};
                uint32_t o[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (ZERO) h[j] = __hsub2(h[j], zd[i]);
                    if (NORM) h[j] = __hmul2(h[j], u32_as_h2(nw[j]));
                    o[j] = h2_as_u32(h[j]);
                }
                *reinterpret_cast<uint4*>(dst + swz(r, c)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        } else if (NORM) {
            unsigned char* wt = ws + st * RAW_BYTES;
#pragma unroll
            for (int i = 0; i < WORDS; ++i) {
                const int idx = tid + i * NC, r = idx >> 3, c = idx & 7;
                uint4* piece = reinterpret_cast<uint4*>(wt + swz(r, c));
                *piece = hmul8(*piece, lds16(nrm + c * 16));
            }
        }
    };
    float acc[BN / 2];  // not zeroed: the first wgmma overwrites
    float ss = 0.f;  // NORM: sum of squares of x row tid / 2, k pieces 4 * (tid % 2) .. + 3 of each tile
    for (int kt = 0; kt < nk; ++kt) {
        const int st = kt % STAGES;
        mbar_wait(full + st, (kt / STAGES) & 1);
        if (CONVERT) {  // wc[kt % 3] held tile kt - 3, whose wgmmas both warpgroups waited for before the last barrier
            convert(st, kt % 3);
            fence_async_smem();
            asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
        } else {
            fence_async_smem();  // the copies this thread saw land, before the async proxy reads them
        }
        const uint32_t xa = smem_u32(xs + st * X_BYTES) + wg * 64 * 128;
        const uint32_t wb = smem_u32(Q ? wc + (kt % 3) * W_BYTES : ws + st * RAW_BYTES);
        mma_fence();
#pragma unroll
        for (int j = 0; j < BK / 16; ++j) mma_m64nNk16<BN>(acc, desc(xa + 32 * j), desc(wb + 32 * j), kt > 0 || j > 0);
        mma_commit();
        if (NORM) {  // while the wgmmas run
            const unsigned char* xt = xs + st * X_BYTES;
#pragma unroll
            for (int j = 0; j < 4; ++j) ss += sumsq8(lds16(xt + swz(tid >> 1, (tid & 1) * 4 + j)));
        }
        mma_wait_one();  // tile kt's wgmmas stay in flight; tile kt - 1's are done, its slot free
        __syncwarp();
        if (kt > 0 && (tid & 31) == 0) mbar_arrive(empty + (kt - 1) % STAGES);
    }
    mma_wait_all();
#pragma unroll
    for (int i = 0; i < BN / 128; ++i) fence_acc(acc + 64 * i);

    // ---- rms factors (consumer threads only: named barrier 1) ------------------------------------
    if (NORM) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        if ((tid & 1) == 0) rstd[tid >> 1] = rsqrtf(ss / static_cast<float>(K) + eps);
        asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
    }

    // ---- epilogue straight from the accumulators -------------------------------------------------
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    constexpr int J = ACT != NONE ? BN / 16 : BN / 8;  // column groups of 8 outputs
    const int n0 = blockIdx.x * (ACT != NONE ? BN / 2 : BN) + 2 * t;
    finish_pairs<ACT, OUT_F32, Q, 2 * J>(out, residual, addend, bias, scales, M, N, [&](int p) {
        const int h = p / J, j = p % J, rl = 64 * wg + 16 * ((tid >> 5) & 3) + g + 8 * h;
        return OutPair{m0 + rl, n0 + 8 * j, NORM ? rstd[rl] : 1.f, acc + 4 * j + 2 * h,
                       acc + 4 * (j + (ACT != NONE ? BN / 16 : 0)) + 2 * h};
    });
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
