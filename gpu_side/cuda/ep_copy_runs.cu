// CopyRunsParams on the GPU (kernel_params.hpp): one block per run, grid-stride over the runs;
// 16-byte words where both ends and the length allow (rows are), else bytes.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

__global__ void copy_runs_kernel(const ep::CopyRun* runs, int64_t num_runs) {
  for (int64_t r = blockIdx.x; r < num_runs; r += gridDim.x) {
    const ep::CopyRun run = runs[r];
    const auto to = reinterpret_cast<uintptr_t>(run.to);
    const auto from = reinterpret_cast<uintptr_t>(run.from);
    if (((to | from | run.bytes) & 15) == 0) {
      auto* out = reinterpret_cast<int4*>(run.to);
      const auto* in = reinterpret_cast<const int4*>(run.from);
      for (uint64_t i = threadIdx.x; i < run.bytes / 16; i += blockDim.x)
        out[i] = in[i];
    } else {
      for (uint64_t i = threadIdx.x; i < run.bytes; i += blockDim.x)
        run.to[i] = run.from[i];
    }
  }
}

}  // namespace

cudaError_t launch_copy_runs(const CopyRunsParams& p, cudaStream_t stream) {
  if (p.num_runs < 0) return cudaErrorInvalidValue;
  if (p.num_runs == 0) return cudaSuccess;
  if (p.runs == nullptr) return cudaErrorInvalidValue;
  const int blocks = static_cast<int>(p.num_runs < kMaxBlocks ? p.num_runs : kMaxBlocks);
  PROXYEP_LAUNCH(copy_runs_kernel, blocks, kThreads, 0, stream)(p.runs, p.num_runs);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
