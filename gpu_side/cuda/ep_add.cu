// AddParams on the GPU (kernel_params.hpp): one thread per element, grid-stride.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ep_launch.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void add_kernel(T* to, const T* from, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    to[i] += from[i];
}

}  // namespace

cudaError_t launch_add(const AddParams& p, cudaStream_t stream) {
  if (p.count < 0) return cudaErrorInvalidValue;
  if (p.count == 0) return cudaSuccess;
  if (p.to == nullptr || p.from == nullptr) return cudaErrorInvalidValue;
  const int blocks = grid_blocks((p.count + kThreads - 1) / kThreads, 0);
  if (p.wide) {
    PROXYEP_LAUNCH(add_kernel, blocks, kThreads, 0, stream)
    (static_cast<int64_t*>(p.to), static_cast<const int64_t*>(p.from), p.count);
  } else {
    PROXYEP_LAUNCH(add_kernel, blocks, kThreads, 0, stream)
    (static_cast<int32_t*>(p.to), static_cast<const int32_t*>(p.from), p.count);
  }
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
