#include "gpu_side/cuda/cuda_error.hpp"

#include "common/error.hpp"

namespace proxyep::gpu_side::cuda {

void raise_cuda_error(const char* phase, const char* what, const char* message) {
  fail(phase, "{} failed: {}", what, message);
}

}  // namespace proxyep::gpu_side::cuda
