// fill_synthetic: seeded weights written on the device (artifacts/synthetic.py is the spec).
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

namespace grokc_synthetic {

__device__ __forceinline__ uint32_t pcg(uint32_t x) {
  uint32_t state = x * 747796405u + 2891336453u;
  uint32_t word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

// fill: 0 bytes (u8), 1 uniform(-scale, scale), 2 (0.5 + u) * scale, 3 constant (f16).
__device__ __forceinline__ void fill(void* out, int n, int kind, int seed, float scale) {
  const uint32_t s = static_cast<uint32_t>(seed);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t h = pcg(s ^ pcg(static_cast<uint32_t>(i)));
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    if (kind == 0) {
      static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(h >> 24);
    } else {
      const float v = kind == 1 ? (2.0f * u - 1.0f) * scale : kind == 2 ? (0.5f + u) * scale : scale;
      static_cast<__half*>(out)[i] = __float2half_rn(v);
    }
  }
}

}  // namespace grokc_synthetic
