// grokc device helpers shared by the kernel headers: 16-byte loads, cp.async, the int4 -> half
// magic-number conversion, one tensor-core MMA shape, warp reductions.
//
// Everything is sm_80+ (mma.sync m16n8k16, cp.async, lop3). No host code, no globals.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace grokc {

// ---- bit casts ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t h2_as_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u32_as_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// ---- global loads -------------------------------------------------------------------------
// A weight byte is read exactly once per launch: skip L1, ask L2 for the whole 128-byte line
// (the neighbouring 64 bytes of the row are the next step's data).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Activations and small per-row tables: ordinary cached 16-byte load.
__device__ __forceinline__ uint4 ldg16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// ---- cp.async (sm_80+) --------------------------------------------------------------------
// 16 bytes global -> shared; when !valid the destination is zero-filled and nothing is read
// (src must still be a mapped address: callers pass the tensor's base).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool valid) {
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// ---- shared loads -------------------------------------------------------------------------
__device__ __forceinline__ uint4 lds16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t lds4(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// ---- int4 -> half2 (abi/int4.py layout) ---------------------------------------------
// A 32-bit word holds codes e0..e7 with nibble j = e0 e2 e4 e6 e1 e3 e5 e7, so
// (w >> 4i) & 0x000F000F is the pair (e_{2i}, e_{2i+1}); OR-ing 0x64006400 makes the half2
// (1024 + e_{2i}, 1024 + e_{2i+1}) exactly, and subtracting 1032 gives (e - 8) exactly.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
    return r;
}

// p[i] = (e_{2i} - 8, e_{2i+1} - 8) for i = 0..3, exact in half.
__device__ __forceinline__ void int4_word_to_h2(uint32_t w, __half2 p[4]) {
    const uint32_t MASK = 0x000F000Fu, MAGIC = 0x64006400u;
    const __half2 BIAS = u32_as_h2(0x64086408u);  // (1032, 1032)
    p[0] = __hsub2(u32_as_h2(lop3_and_or(w, MASK, MAGIC)), BIAS);
    p[1] = __hsub2(u32_as_h2(lop3_and_or(w >> 4, MASK, MAGIC)), BIAS);
    p[2] = __hsub2(u32_as_h2(lop3_and_or(w >> 8, MASK, MAGIC)), BIAS);
    p[3] = __hsub2(u32_as_h2(lop3_and_or(w >> 12, MASK, MAGIC)), BIAS);
}

// ---- tensor cores -------------------------------------------------------------------------
// D = A(16x16, row) * B(16x8, col) + D, f16 inputs, f32 accumulators. Fragment layout, with
// g = lane / 4 and t = lane % 4: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
// a[3] = A[g+8][2t+8..]; b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
// d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A q4 word (abi/int4.py's pair order) as A-fragment pairs with no arithmetic but masks: as
// f16 subnormals, (w & 0x000F000F) is the codes (e0, e1) * 2^-24 exactly and (w & 0x00F000F0) is
// (e2, e3) * 2^-20, so p[0], p[2] hold pairs 0-1 and 4-5 at scale 2^-24 and p[1], p[3] pairs 2-3
// and 6-7 at 2^-20. Tensor cores multiply subnormals exactly; an MMA whose A registers share one
// scale gives that scale times the codes' dot product (kRawLo, kRawHi undo it), and the codes'
// offset (the zero point, else 8) comes off the sum as offset * sum(B). One shift and four ANDs a
// word, against nine instructions for (e - 8) as normal halves (q4_pairs in linear_gemv2.cuh).
__device__ __forceinline__ void q4_raw(uint32_t w, uint32_t p[4]) {
    const uint32_t w8 = w >> 8;
    p[0] = w & 0x000F000Fu;
    p[1] = w & 0x00F000F0u;
    p[2] = w8 & 0x000F000Fu;
    p[3] = w8 & 0x00F000F0u;
}
constexpr float kRawLo = 16777216.f, kRawHi = 1048576.f;  // 2^24, 2^20

// ---- reductions and math ------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// The 8 halves of a times those of b (x times the norm weight, rounded to f16 once).
__device__ __forceinline__ uint4 hmul8(uint4 a, uint4 b) {
    return make_uint4(h2_as_u32(__hmul2(u32_as_h2(a.x), u32_as_h2(b.x))), h2_as_u32(__hmul2(u32_as_h2(a.y), u32_as_h2(b.y))),
                      h2_as_u32(__hmul2(u32_as_h2(a.z), u32_as_h2(b.z))), h2_as_u32(__hmul2(u32_as_h2(a.w), u32_as_h2(b.w))));
}

// Sum of squares of the 8 halves of a 16-byte vector, in fp32.
__device__ __forceinline__ float sumsq8(uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __half22float2(u32_as_h2(w[i]));
        s = fmaf(f.x, f.x, s);
        s = fmaf(f.y, f.y, s);
    }
    return s;
}

}  // namespace grokc
