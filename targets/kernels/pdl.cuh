// Programmatic dependent launch (sm_90 and newer): a kernel lets the next kernel of its CUDA graph
// start launching at once, then waits until the previous kernel has finished and its writes are
// visible. The runner joins two launches with a programmatic edge only when the second kernel is
// built with this entry (KernelChoice.pdl); before sm_90 both instructions compile to nothing.
#pragma once

#ifdef GROKC_TRACE
#include "trace.cuh"
#define GROKC_TRACE_MARK(i) grokc_trace::mark(i)
#else
#define GROKC_TRACE_MARK(i) ((void)0)
#endif

__device__ __forceinline__ void grokc_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grokc_pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef GROKC_TRACE
  grokc_trace::mark_wait();
#endif
}

// The entry of a kernel that reads its inputs right away: trigger the next launch, then wait.
__device__ __forceinline__ void grokc_pdl_entry() {
  grokc_pdl_launch_dependents();
  grokc_pdl_wait();
}
