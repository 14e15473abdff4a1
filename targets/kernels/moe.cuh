// Mixture-of-experts kernels (artifacts/kernel_abi.py: moe_route, moe_gather, moe_linear,
// moe_combine): the router's choice, the rows grouped by expert, and the experts' GEMVs / GEMMs,
// all on the device, so a graph stays a fixed list of launches whatever the tokens choose.
//
// moe_route: one block. Phase 1, one warp per token: its <= 256 logits in registers (8 a lane),
// top_k rounds of a warp argmax (ties: lower index), the softmax denominator by a warp sum; the
// chosen experts go to slot_rows as scratch and are counted in shared memory. Phase 2: thread 0
// scans the counts into offsets and the active list. Phase 3: each thread owns experts (e = tid,
// tid + 256, ...) and walks the entries in (token, slot) order through shared-memory tiles, giving
// each of its entries the next row of its expert: the rows of an expert come out in token order,
// the same on every run.
//
// Entry points call grokc_pdl_entry() first (route, gather, combine) or, for moe_linear, wait
// before reading the routing (the gemv2 and gemm bodies trigger the next launch themselves).
//
// moe_linear: the experts' products in the rows the route grouped. Its kernels wait for the
// previous launch first (the expert ids come from it), then
// - gemv2 (few rows an expert, T <= 8): grid.y walks the active experts; each block runs
//   linear_gemv2.cuh's body on its expert's slice of the weights and its expert's rows, so only
//   chosen experts' weights are read (gate and up of an expert in one pass: silu_mul rows);
// - gemm (prefill): grid.y is the tiles of BM rows of every active expert in turn (an upper bound:
//   ceil(R / BM) + min(E', R), later blocks exit); each block runs linear_gemm.cuh's body on its
//   expert's slice and its tile;
// - ref: one thread per output, fp32 (any K % 8 == 0, any group size).
// moe_combine: one block per token, the weighted sum of its entries' rows (slot order) plus the
// residual.
#pragma once

#include "linear_gemm.cuh"
#include "linear_gemv2.cuh"
#include "linear_ref.cuh"
#include "pdl.cuh"

// The C signature of every moe_linear kernel (KERNEL_ABI["moe_linear"], in order).
#define GROKC_MOE_LINEAR_PARAMS                                                                     \
    void *out, const __half *__restrict__ x, const void *__restrict__ weight,                       \
        const __half *__restrict__ scales, const __half *__restrict__ zeros,                        \
        const int *__restrict__ offsets, const int *__restrict__ active, int T, int R, int N, int K,  \
        int group_size, int n_experts
#define GROKC_MOE_LINEAR_ARGS out, x, weight, scales, zeros, offsets, active, T, R, N, K, group_size, n_experts

namespace grokc {
namespace moe {

constexpr int ROUTE_THREADS = 256;
constexpr int MAX_ROUTED = 256;            // logits one warp ranks: 8 a lane
constexpr int MAX_STACKED = 1024;          // experts (shared chunks included) counted in shared memory
constexpr int ROUTE_TILE = 2048;           // entries per shared-memory tile of phase 3
constexpr int OWN = MAX_STACKED / ROUTE_THREADS;  // experts a thread owns in phase 3

__device__ __forceinline__ bool better(float v, int e, float bv, int be) {
    return e >= 0 && (be < 0 || v > bv || (v == bv && e < be));
}

__device__ __forceinline__ void route(float* __restrict__ weights, int* __restrict__ slot_rows,
                                      int* __restrict__ row_token, int* __restrict__ offsets, int* __restrict__ active,
                                      const float* __restrict__ logits, const int* __restrict__ n_real, int T,
                                      int n_experts, int top_k, int n_shared, int norm_top_k, int shared_gate) {
    __shared__ int count[MAX_STACKED];
    __shared__ int start[MAX_STACKED];
    __shared__ int tile[ROUTE_TILE];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = ROUTE_THREADS / 32;
    const int S = top_k + n_shared, stacked = n_experts + n_shared, stride = n_experts + (shared_gate ? 1 : 0);
    int n = n_real != nullptr ? n_real[0] : T;
    n = n < 0 ? 0 : (n > T ? T : n);
    for (int e = tid; e < stacked; e += ROUTE_THREADS) count[e] = 0;
    __syncthreads();

    // ---- phase 1: each token's choice -----------------------------------------------------------
    for (int t = warp; t < T; t += nwarps) {
        float* w = weights + static_cast<size_t>(t) * S;
        int* sr = slot_rows + static_cast<size_t>(t) * S;
        if (t >= n) {
            for (int s = lane; s < S; s += 32) w[s] = 0.f, sr[s] = -1;
            continue;
        }
        const float* l = logits + static_cast<size_t>(t) * stride;
        float v[MAX_ROUTED / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < MAX_ROUTED / 32; ++j) {
            const int e = lane + 32 * j;
            v[j] = e < n_experts ? l[e] : -INFINITY;
            mx = fmaxf(mx, v[j]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < MAX_ROUTED / 32; ++j)
            if (lane + 32 * j < n_experts) sum += expf(v[j] - mx);
        sum = warp_sum(sum);
        unsigned taken = 0u;
        float chosen = 0.f;
        for (int s = 0; s < top_k; ++s) {
            float bv = -INFINITY;
            int be = -1;
#pragma unroll
            for (int j = 0; j < MAX_ROUTED / 32; ++j) {
                const int e = lane + 32 * j;
                if (e < n_experts && !((taken >> j) & 1u) && better(v[j], e, bv, be)) bv = v[j], be = e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oe = __shfl_xor_sync(0xffffffffu, be, o);
                if (better(ov, oe, bv, be)) bv = ov, be = oe;
            }
            if (be >= 0 && (be & 31) == lane) taken |= 1u << (be >> 5);
            const float p = expf(bv - mx) / sum;
            chosen += p;
            if (lane == 0) w[s] = p, sr[s] = be;
        }
        if (lane == 0) {
            if (norm_top_k)
                for (int s = 0; s < top_k; ++s) w[s] = w[s] / chosen;
            const float g = shared_gate ? 1.f / (1.f + expf(-l[n_experts])) : 1.f;
            for (int j = 0; j < n_shared; ++j) w[top_k + j] = g, sr[top_k + j] = n_experts + j;
            for (int s = 0; s < S; ++s) atomicAdd(&count[sr[s]], 1);
        }
    }
    __syncthreads();

    // ---- phase 2: offsets and the active list ------------------------------------------------------
    if (tid == 0) {
        int acc = 0, used = 0;
        for (int e = 0; e < stacked; ++e) {
            start[e] = acc;
            offsets[e] = acc;
            if (count[e] > 0) active[1 + used++] = e;
            acc += count[e];
        }
        offsets[stacked] = acc;
        active[0] = used;
        for (int j = used; j < stacked; ++j) active[1 + j] = 0;
    }
    __syncthreads();

    // ---- phase 3: rows, by expert, in token order --------------------------------------------------
    int cursor[OWN];
#pragma unroll
    for (int q = 0; q < OWN; ++q) {
        const int e = tid + q * ROUTE_THREADS;
        cursor[q] = e < stacked ? start[e] : 0;
    }
    const int entries = n * S;
    for (int base = 0; base < entries; base += ROUTE_TILE) {
        const int len = entries - base < ROUTE_TILE ? entries - base : ROUTE_TILE;
        __syncthreads();  // the previous tile is read by everyone
        for (int i = tid; i < len; i += ROUTE_THREADS) tile[i] = slot_rows[base + i];
        __syncthreads();
#pragma unroll
        for (int q = 0; q < OWN; ++q) {
            const int e = tid + q * ROUTE_THREADS;
            if (e >= stacked) break;
            for (int i = 0; i < len; ++i) {
                if (tile[i] != e) continue;
                const int row = cursor[q]++;
                slot_rows[base + i] = row;
                row_token[row] = (base + i) / S;
            }
        }
    }
    for (int r = entries + tid; r < T * S; r += ROUTE_THREADS) row_token[r] = 0;
}

// moe_gather: one warp per row (hidden % 8 == 0: 16-byte pieces).
template <int WARPS>
__device__ __forceinline__ void gather(__half* __restrict__ out, const __half* __restrict__ x,
                                       const __half* __restrict__ norm, const int* __restrict__ row_token,
                                       const int* __restrict__ offsets, int T, int R, int hidden, int n_experts,
                                       float eps) {
    const int lane = threadIdx.x & 31, r = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= offsets[n_experts] || r >= R) return;
    const __half* xr = x + static_cast<size_t>(row_token[r]) * hidden;
    float rs = 1.f;
    if (norm != nullptr) {
        float ss = 0.f;
        for (int k = lane * 8; k < hidden; k += 256) ss += sumsq8(ldg16(xr + k));
        rs = rsqrtf(warp_sum(ss) / static_cast<float>(hidden) + eps);
    }
    __half* o = out + static_cast<size_t>(r) * hidden;
    for (int k = lane * 8; k < hidden; k += 256) {
        const uint4 v = ldg16(xr + k);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint4 nv = make_uint4(0u, 0u, 0u, 0u);
        if (norm != nullptr) nv = ldg16(norm + k);
        const uint32_t g[4] = {nv.x, nv.y, nv.z, nv.w};
        uint32_t res[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float2 f = __half22float2(u32_as_h2(w[i]));
            if (norm != nullptr) {
                const float2 gn = __half22float2(u32_as_h2(g[i]));
                f.x = f.x * rs * gn.x;
                f.y = f.y * rs * gn.y;
            }
            res[i] = h2_as_u32(__floats2half2_rn(f.x, f.y));
        }
        *reinterpret_cast<uint4*>(o + k) = make_uint4(res[0], res[1], res[2], res[3]);
    }
}

// moe_combine: one block per token.
__device__ __forceinline__ void combine(__half* out, const float* __restrict__ y, const float* __restrict__ weights,
                                        const int* __restrict__ slot_rows, const __half* residual, int T, int hidden,
                                        int S) {
    const int t = blockIdx.x;
    const int* sr = slot_rows + static_cast<size_t>(t) * S;
    const float* w = weights + static_cast<size_t>(t) * S;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
        const size_t i = static_cast<size_t>(t) * hidden + h;
        float acc = residual != nullptr ? __half2float(residual[i]) : 0.f;  // out may alias residual: read first
        for (int s = 0; s < S; ++s)
            if (sr[s] >= 0) acc += w[s] * y[static_cast<size_t>(sr[s]) * hidden + h];
        out[i] = __float2half_rn(acc);
    }
}

// ---- moe_linear ---------------------------------------------------------------------------------
// Expert e's slice of the stacked weight, scales and zeros.
template <int WF, int ACT>
struct Expert {
    const void* weight;
    const __half* scales;
    const __half* zeros;
    __device__ __forceinline__ Expert(int e, const void* w, const __half* s, const __half* z, int N, int K,
                                      int group_size) {
        const size_t nw = (ACT != linear::NONE) ? 2 * static_cast<size_t>(N) : N;
        const size_t groups = group_size > 0 ? (K + group_size - 1) / group_size : 1;
        weight = static_cast<const unsigned char*>(w) + static_cast<size_t>(e) * nw * gemv2::weight_bytes<WF>(K);
        scales = s == nullptr ? nullptr : s + static_cast<size_t>(e) * nw * groups;
        zeros = z == nullptr ? nullptr : z + static_cast<size_t>(e) * nw * groups;
    }
};

template <bool OUT_F32>
__device__ __forceinline__ void* row_ptr(void* out, size_t row, int N) {
    return static_cast<unsigned char*>(out) + row * N * (OUT_F32 ? 4 : 2);
}

// (RG: linear_gemv2.cuh's R, the row groups a warp streams; R here is the ABI's rows.)
template <int WF, int ACT, bool OUT_F32, int RG, int KS, int WN, int D, int PF, int NL, int TR, bool ZERO>
__device__ __forceinline__ void gemv2_rows(GROKC_MOE_LINEAR_PARAMS) {
    grokc_pdl_wait();  // the expert ids and rows are the previous launches' output
    const int used = active[0];
    for (int j = blockIdx.y; j < used; j += gridDim.y) {  // block-uniform
        const int e = active[1 + j], r0 = offsets[e], rows = offsets[e + 1] - r0;
        const Expert<WF, ACT> ex(e, weight, scales, zeros, N, K, group_size);
        for (int c = 0; c < rows; c += gemv2::MAXM) {
            const int m = rows - c < gemv2::MAXM ? rows - c : gemv2::MAXM;
            gemv2::body<WF, ACT, OUT_F32, RG, KS, WN, D, PF, NL, TR, 0, false, ZERO>(
                row_ptr<OUT_F32>(out, r0 + c, N), x + static_cast<size_t>(r0 + c) * K, ex.weight, ex.scales, ex.zeros,
                nullptr, nullptr, nullptr, nullptr, m, N, K, group_size, 0.f);
            __syncthreads();  // the next chunk restages x in the same shared memory
        }
    }
}

template <int WF, int ACT, bool OUT_F32, int RG, int KS, int WN, int D, int PF, int NL, int TR>
__device__ __forceinline__ void linear_gemv2(GROKC_MOE_LINEAR_PARAMS) {
    if (WF != linear::F16 && zeros != nullptr)
        gemv2_rows<WF, ACT, OUT_F32, RG, KS, WN, D, PF, NL, TR, true>(GROKC_MOE_LINEAR_ARGS);
    else
        gemv2_rows<WF, ACT, OUT_F32, RG, KS, WN, D, PF, NL, TR, false>(GROKC_MOE_LINEAR_ARGS);
}

template <int WF, int ACT, bool OUT_F32, int BM, int BN, int WM, int WN, int STAGES, bool ZERO>
__device__ __forceinline__ void gemm_tile(GROKC_MOE_LINEAR_PARAMS) {
    __shared__ int tile_expert, tile_row, tile_rows;
    grokc_pdl_wait();
    if (threadIdx.x == 0) {  // this block's tile: the blockIdx.y-th of the active experts' tiles of BM rows
        int y = blockIdx.y;
        tile_expert = -1;
        for (int j = 0; j < active[0]; ++j) {
            const int e = active[1 + j], rows = offsets[e + 1] - offsets[e], tiles = (rows + BM - 1) / BM;
            if (y < tiles) {
                tile_expert = e, tile_row = offsets[e] + y * BM;
                tile_rows = rows - y * BM < BM ? rows - y * BM : BM;
                break;
            }
            y -= tiles;
        }
    }
    __syncthreads();
    if (tile_expert < 0) return;
    const Expert<WF, ACT> ex(tile_expert, weight, scales, zeros, N, K, group_size);
    gemm::linear_gemm_body<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, false, ZERO>(
        row_ptr<OUT_F32>(out, tile_row, N), x + static_cast<size_t>(tile_row) * K, ex.weight, ex.scales, ex.zeros,
        nullptr, nullptr, nullptr, nullptr, tile_rows, N, K, group_size, 0.f, 0);
}

template <int WF, int ACT, bool OUT_F32, int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void linear_gemm(GROKC_MOE_LINEAR_PARAMS) {
    if (WF != linear::F16 && zeros != nullptr)
        gemm_tile<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, true>(GROKC_MOE_LINEAR_ARGS);
    else
        gemm_tile<WF, ACT, OUT_F32, BM, BN, WM, WN, STAGES, false>(GROKC_MOE_LINEAR_ARGS);
}

// Fallback: grid (ceil(N / 128), R), one thread per output of row blockIdx.y.
template <int WF, int ACT, bool OUT_F32>
__device__ __forceinline__ void linear_ref(GROKC_MOE_LINEAR_PARAMS) {
    grokc_pdl_wait();
    const int r = blockIdx.y, n = blockIdx.x * ref::THREADS + threadIdx.x;
    if (r >= offsets[n_experts] || n >= N) return;
    int e = 0;
    while (offsets[e + 1] <= r) ++e;  // the expert whose rows hold r
    const Expert<WF, ACT> ex(e, weight, scales, zeros, N, K, group_size);
    const __half* xr = x + static_cast<size_t>(r) * K;
    float gate = 0.f, up = 0.f;
    for (int k = 0; k < K; ++k) {
        const float xv = __half2float(xr[k]);
        gate = fmaf(xv, ref::weight_at<WF>(ex.weight, ex.scales, ex.zeros, n, k, K, group_size), gate);
        if (ACT != linear::NONE)
            up = fmaf(xv, ref::weight_at<WF>(ex.weight, ex.scales, ex.zeros, N + n, k, K, group_size), up);
    }
    linear::finish<ACT, OUT_F32>(out, nullptr, nullptr, nullptr, r, n, N, gate, up);
}

}  // namespace moe
}  // namespace grokc
