// How fast can blocks stream their weights from HBM into shared memory? bench/probes/stream_probe.py.
//
// Every block copies its own contiguous `bytes` of `src` (block b: src + b * bytes) into dynamic
// shared memory, one of four ways, and thread 0 records %globaltimer when the block began and when
// every byte had landed:
//   MODE 0: `copies` bulk copies (cp.async.bulk, the TMA) issued by thread 0, an mbarrier each;
//   MODE 1: the same copies issued by the 32 lanes of warp 0 in turn (lane l: copies l, l + 32, ..);
//   MODE 2: cp.async.cg of 16 bytes by every thread, then cp.async.wait_all;
//   MODE 3: ld.global.nc of 16 bytes into registers, 8 in flight a thread, then st.shared.
#include <stdint.h>

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

template <int MODE>
__device__ void stream(const uint8_t* src, uint64_t* times, uint32_t* sink, int bytes, int copies) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + bytes);
  const int tid = threadIdx.x, b = blockIdx.x;
  const uint8_t* from = src + (size_t)b * bytes;
  if (tid == 0)
    for (int i = 0; i < copies; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(bars + i)));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const uint64_t t0 = now();
  if (MODE == 0 || MODE == 1) {
    const int piece = bytes / copies;
    const bool issuer = MODE == 0 ? tid == 0 : tid < 32;
    if (issuer)
      for (int i = MODE == 0 ? 0 : tid; i < copies; i += MODE == 0 ? 1 : 32) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bars + i)), "r"(piece)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                saddr(smem + i * piece)),
            "l"(from + (size_t)i * piece), "r"(piece), "r"(saddr(bars + i))
            : "memory");
      }
    for (int i = 0; i < copies; ++i) {
      uint32_t ok = 0;
      while (!ok)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(saddr(bars + i)) : "memory");
    }
  } else if (MODE == 2) {
    for (int i = tid; i < bytes / 16; i += blockDim.x)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(smem + 16 * i)), "l"(from + 16 * i)
                   : "memory");
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {
    for (int base = 0; base < bytes / 16; base += 8 * blockDim.x) {
      uint4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = base + j * blockDim.x + tid;
        if (i < bytes / 16) v[j] = __ldg(reinterpret_cast<const uint4*>(from) + i);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = base + j * blockDim.x + tid;
        if (i < bytes / 16) reinterpret_cast<uint4*>(smem)[i] = v[j];
      }
    }
  }
  __syncthreads();
  if (tid == 0) times[2 * b] = t0, times[2 * b + 1] = now();
  const uint4 v = reinterpret_cast<const uint4*>(smem)[tid];  // keeps every mode's stores live
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x9e3779b9u) atomicAdd(sink, 1u);
}

extern "C" __global__ void __launch_bounds__(512) stream_bulk(const uint8_t* src, uint64_t* times, uint32_t* sink,
                                                              int bytes, int copies) {
  stream<0>(src, times, sink, bytes, copies);
}
extern "C" __global__ void __launch_bounds__(512) stream_bulk_lanes(const uint8_t* src, uint64_t* times,
                                                                    uint32_t* sink, int bytes, int copies) {
  stream<1>(src, times, sink, bytes, copies);
}
extern "C" __global__ void __launch_bounds__(512) stream_cp_async(const uint8_t* src, uint64_t* times, uint32_t* sink,
                                                                  int bytes, int copies) {
  stream<2>(src, times, sink, bytes, copies);
}
extern "C" __global__ void __launch_bounds__(512) stream_ldg(const uint8_t* src, uint64_t* times, uint32_t* sink,
                                                             int bytes, int copies) {
  stream<3>(src, times, sink, bytes, copies);
}
