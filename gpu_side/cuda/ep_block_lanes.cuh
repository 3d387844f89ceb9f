// The thread block as the `Lanes` policy of gpu_side/ep/row_rules.hpp: lane = threadIdx.x,
// lanes = blockDim.x, and the token bytes are copied cooperatively in 16-byte units (DeepEP's
// int4 copies) when both ends are 16-byte aligned, bytewise otherwise. Shared by the EP kernels
// (each .cu includes it; it holds no kernel, so no device link step is needed).
#pragma once

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side::cuda {

struct BlockLanes {
  __device__ uint32_t lane() const { return threadIdx.x; }
  __device__ uint32_t count() const { return blockDim.x; }

  __device__ void copy_bytes(std::byte* to, const std::byte* from, uint64_t n) const {
    uint64_t done = 0;
    if (((reinterpret_cast<uintptr_t>(to) | reinterpret_cast<uintptr_t>(from)) & 15u) == 0) {
      auto* dst = reinterpret_cast<uint4*>(to);
      const auto* src = reinterpret_cast<const uint4*>(from);
      const uint64_t units = n / 16;
      // The source is read once and never written by this kernel: the non-coherent path is safe.
      for (uint64_t i = threadIdx.x; i < units; i += blockDim.x)
        dst[i] = __ldg(src + i);
      done = units * 16;
    }
    for (uint64_t i = done + threadIdx.x; i < n; i += blockDim.x)
      to[i] = from[i];
  }
};

}  // namespace proxyep::gpu_side::cuda
