// Block timeline of a traced build (targets/nvcc.py, trace=True; bench/probes/trace_plan.py reads it).
// Every entry point opens a grokc_trace::Scope: per block, the %globaltimer at entry, when
// griddepcontrol.wait returned (0 when the kernel never waits) and at exit, the kernel's index in
// the sorted symbols of the translation unit, the block and its multiprocessor, and up to kMarks
// phase marks a kernel sets with GROKC_TRACE_MARK(i) (kernels/pdl.cuh; 0 where unset). Only traced
// builds define GROKC_TRACE; artifacts never hold this code.
#pragma once

#ifdef GROKC_TRACE
namespace grokc_trace {

constexpr int kMarks = 3;

struct Record {
  unsigned long long start, wait, end, marks[kMarks];
  unsigned int kernel, block, smid, pad;
};
constexpr unsigned int kCapacity = 1u << 18;
__device__ Record records[kCapacity];
__device__ unsigned int count;
__shared__ unsigned long long start_ns, wait_ns, marks_ns[kMarks];  // shared: traced kernels keep their registers

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool first_thread() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }

__device__ __forceinline__ void mark_wait() {
  if (first_thread()) wait_ns = now();
}

// Phase mark i: the time the block's first thread passes it (after a __syncthreads, the block's).
__device__ __forceinline__ void mark(int i) {
  if (first_thread()) marks_ns[i] = now();
}

struct Scope {
  unsigned int kernel;
  __device__ explicit Scope(unsigned int k) : kernel(k) {
    if (first_thread()) {
      start_ns = now();
      wait_ns = 0;
      for (int i = 0; i < kMarks; ++i) marks_ns[i] = 0;
    }
  }
  __device__ ~Scope() {
    __syncthreads();
    if (first_thread()) {
      unsigned int sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      const unsigned int i = atomicAdd(&count, 1u);
      if (i < kCapacity)
        records[i] = Record{start_ns, wait_ns, now(), {marks_ns[0], marks_ns[1], marks_ns[2]}, kernel,
                            blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), sm, 0u};
    }
  }
};

}  // namespace grokc_trace
#endif
