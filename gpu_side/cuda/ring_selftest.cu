#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ring_producer.cuh"
#include "gpu_side/cuda/ring_selftest.hpp"

#include "gpu_side/cuda/cuda_error.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr const char* kPhase = "gpu_side.ring_selftest";

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) raise_cuda_error(kPhase, what, cudaGetErrorString(status));
}

__global__ void ring_selftest_kernel(DeviceRing ring, uint64_t per_block, uint64_t timeout_ns,
                                     unsigned long long* failures) {
  for (uint64_t i = threadIdx.x; i < per_block; i += blockDim.x) {
    if (!device_push(ring, selftest_descriptor(blockIdx.x, i, per_block), timeout_ns)) {
      atomicAdd(failures, 1ull);
      return;
    }
  }
}

}  // namespace

// Device counters live in one allocation: head, cached tail, failures.
struct RingSelftest::State {
  DeviceRing ring{};
  SelftestConfig config;
  uint64_t* counters = nullptr;
  cudaStream_t stream = nullptr;
};

RingSelftest::RingSelftest(void* device_ring, uint64_t capacity, const SelftestConfig& config)
    : state_(std::make_unique<State>()) {
  if (!is_power_of_two(capacity))
    raise_cuda_error(kPhase, "RingSelftest", "ring capacity is not a power of two");
  state_->config = config;
  check(cudaMalloc(&state_->counters, 3 * sizeof(uint64_t)), "cudaMalloc(counters)");
  check(cudaMemset(state_->counters, 0, 3 * sizeof(uint64_t)), "cudaMemset(counters)");
  check(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  auto* header = static_cast<RingHeader*>(device_ring);
  state_->ring =
      DeviceRing{header, ring_slots(header), capacity, &state_->counters[0], &state_->counters[1]};
}

RingSelftest::~RingSelftest() {
  if (state_->stream != nullptr) (void)cudaStreamDestroy(state_->stream);
  if (state_->counters != nullptr) (void)cudaFree(state_->counters);
}

void RingSelftest::launch() {
  const SelftestConfig& c = state_->config;
  PROXYEP_LAUNCH(ring_selftest_kernel, c.blocks, c.threads_per_block, 0, state_->stream)
  (state_->ring, c.per_block, c.timeout_ns,
   reinterpret_cast<unsigned long long*>(&state_->counters[2]));
  check(cudaGetLastError(), "ring_selftest_kernel launch");
}

uint64_t RingSelftest::finish() {
  check(cudaStreamSynchronize(state_->stream), "ring_selftest_kernel");
  uint64_t failures = 0;
  check(cudaMemcpy(&failures, &state_->counters[2], sizeof(failures), cudaMemcpyDeviceToHost),
        "cudaMemcpy(failures)");
  return failures;
}

}  // namespace proxyep::gpu_side::cuda
