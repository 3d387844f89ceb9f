// Host-compiled parts of the EP kernels' entry points: error translation (through
// cuda_error.hpp, since .cu files cannot include common/error.hpp) and launch sizing.
#include "gpu_side/cuda/ep_kernels.hpp"

#include "gpu_side/cuda/cuda_error.hpp"
#include "gpu_side/cuda/ep_launch.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

namespace proxyep::gpu_side::cuda {

void check_cuda(cudaError_t status, const char* phase, const char* what) {
  if (status != cudaSuccess) raise_cuda_error(phase, what, cudaGetErrorString(status));
}

int multiprocessor_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    // Cleared: the launcher returns cudaGetLastError() after its launch, which would report
    // this query's failure as the launch's.
    (void)cudaGetLastError();
    return 1;
  }
  return std::max(count, 1);
}

int grid_blocks(int64_t work, int requested) {
  // Four blocks per multiprocessor hide one block's memory stalls behind the others'.
  const int64_t wanted = requested > 0 ? requested : int64_t{4} * multiprocessor_count();
  return static_cast<int>(std::clamp<int64_t>(std::min(wanted, work), 1, int64_t{1} << 30));
}

}  // namespace proxyep::gpu_side::cuda
