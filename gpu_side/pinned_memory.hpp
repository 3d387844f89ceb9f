// CUDA mapped pinned host memory for rings a GPU produces into (cuda/ring_producer.cuh) and a
// host thread consumes: cudaHostAlloc(Mapped | Portable), zeroed, page-rounded, owned by a
// proxyep::HostMemory (common/host_memory.hpp) whose device() is the address kernels use.
// Only in builds with PROXYEP_HAVE_CUDA.
#pragma once

#include "common/host_memory.hpp"

#include <cstddef>

namespace proxyep::gpu_side {

#if PROXYEP_HAVE_CUDA
HostMemory cuda_pinned_memory(size_t bytes);
#endif

}  // namespace proxyep::gpu_side
