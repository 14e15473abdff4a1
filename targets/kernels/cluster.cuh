// Thread-block clusters (sm_90 and newer): the rank of this block in its cluster, a barrier over the
// cluster's threads, and the address of a variable in another block's shared memory. A kernel uses
// them only when it carries __cluster_dims__; before sm_90 the rank is 0 and the rest traps.
#pragma once

#include <stdint.h>

__device__ __forceinline__ int grokc_cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
#else
  return 0;
#endif
}

// Every thread of every block of the cluster arrives; writes before it (shared memory included) are
// visible to reads after it in any block of the cluster.
__device__ __forceinline__ void grokc_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // not .aligned: callers reach it right after divergent loops
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}

// The generic address of `*local` in the shared memory of block `rank` of this cluster (distributed
// shared memory); plain loads and stores through it reach that block.
template <class T>
__device__ __forceinline__ T* grokc_cluster_map(T* local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t remote;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(remote) : "l"(reinterpret_cast<uint64_t>(local)), "r"(rank));
  return reinterpret_cast<T*>(remote);
#else
  __trap();
  return local;
#endif
}
