// Buffer calls with CUDA tensors on one GPU, ranks as threads of this process (each rank its own
// CudaDevice, i.e. its own stream, on device 0): the cases tests/unit/integrations/
// test_device_buffer_threads.cpp runs on the host-simulated device (device_buffer_case.hpp,
// device_ll_case.hpp).
// Exits 77 (skipped) without a usable CUDA device.
#include "gpu_side/cuda/cuda_device.hpp"
#include "tests/gpu/device_check.hpp"
#include "tests/unit/integrations/device_buffer_case.hpp"
#include "tests/unit/integrations/device_ll_captured_case.hpp"
#include "tests/unit/integrations/device_ll_case.hpp"

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

using namespace proxyep;

namespace {

// The Buffer's stream and the caller's: two streams of device 0.
integrations::testing::RankDevice cuda_device(int) {
  return {std::make_shared<gpu_side::cuda::CudaDevice>(0),
          std::make_shared<gpu_side::cuda::CudaDevice>(0)};
}

}  // namespace

TEST_CASE("CUDA tensors through the Buffer: node peers (ranks as threads on one GPU)") {
  integrations::testing::run_device_buffer(integrations::testing::kRanks, cuda_device);
}

TEST_CASE("CUDA tensors through the Buffer: over the fabric with the reorder shim") {
  integrations::testing::run_device_buffer(1, cuda_device);
}

TEST_CASE("CUDA tensors through low-latency calls: node peers (ranks as threads on one GPU)") {
  integrations::testing::ll::run_device_ll(integrations::testing::ll::kRanks, cuda_device);
}

TEST_CASE("CUDA tensors through low-latency calls: over the fabric with the reorder shim") {
  integrations::testing::ll::run_device_ll(1, cuda_device);
}

TEST_CASE("CUDA low-latency calls captured into graphs (ranks as threads on one GPU)") {
  integrations::testing::ll::run_captured_ll(cuda_device, false);
  integrations::testing::ll::run_captured_ll(cuda_device, true);
  integrations::testing::ll::run_captured_ll(cuda_device, true, true);
  integrations::testing::ll::run_captured_ll(cuda_device, true, false, true);
  integrations::testing::ll::run_captured_ll_refused(cuda_device);
}

// Every rank on its own node: the graphs' writes go through the proxies over tcp (step memory
// in host memory registered with the GPU: tcp registers no device memory), the arrivals counted
// in signal words the GPU waits on.
TEST_CASE("CUDA low-latency calls captured into graphs between nodes (through the proxies)") {
  integrations::testing::ll::run_captured_ll(cuda_device, false, false, false, 1);
  integrations::testing::ll::run_captured_ll(cuda_device, true, true, false, 1);
}

int main(int argc, char** argv) {
  if (!testing::cuda_device_present()) return testing::kSkipExitCode;
  doctest::Context context(argc, argv);
  return context.run();
}
