// The device Buffer cases (tests/unit/integrations/device_buffer_case.hpp, device_ll_case.hpp)
// as one rank of a launched job (`proxyep launch -n 2 -- ep_device_buffer -tc=...`), so they run
// where ranks-as-threads cannot: with the proxy in the node daemons (proxy.mode = daemon,
// tests/daemon/test_proxyepd.py), whose device ring the simulated device's stream pushes into;
// and as two processes on one node (PROXYEP_TEST_RANKS_PER_NODE=2), whose device arenas each
// opens in the other process, as CUDA IPC does. One rank per node unless that says otherwise
// (test case names hold no comma: -tc splits at commas). Built a second time with
// PROXYEP_TEST_CUDA_DEVICE (tests/gpu: gpu.buffer_2processes) on CUDA: two processes on one GPU,
// whose device arenas are opened by real CUDA IPC; it exits 77 (skipped) without a device.
// On the simulated device rank 0's Buffer stream
// is slow (5 ms per operation: a write posted before its packing ran sends stale bytes), rank 1's
// runs nothing until waited for (a wait that does not first have the stream push what it was handed
// never ends).
#include "control/bootstrap.hpp"
#include "gpu_side/device/simulated_device.hpp"
#ifdef PROXYEP_TEST_CUDA_DEVICE
#include "gpu_side/cuda/cuda_device.hpp"
#include "tests/gpu/device_check.hpp"
#define DOCTEST_CONFIG_IMPLEMENT
#endif
#include "tests/unit/integrations/device_buffer_case.hpp"
#include "tests/unit/integrations/device_ll_captured_case.hpp"
#include "tests/unit/integrations/device_ll_case.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string_view>

using namespace proxyep;
namespace device = gpu_side::device;

namespace {

// PROXYEP_TEST_NIC_DEVICE_MEMORY: the simulated devices offer memory a NIC reads; "1": the job's
// fabric registers device memory (FI_HMEM; the daemons' shm in a build with CUDA), so chunks to
// other nodes must leave from device staging and rows land in device arenas
// (run_device_buffer_rank's nic_device_memory); "declined": it does not, so neither may happen.
// On CUDA the fabric alone decides; the cases check nothing of it there.
std::string_view nic_setting() {
#ifdef PROXYEP_TEST_CUDA_DEVICE
  return "";
#else
  const char* value = std::getenv("PROXYEP_TEST_NIC_DEVICE_MEMORY");
  return value != nullptr ? value : "";
#endif
}

bool nic_reads() {
  return nic_setting() == "1" || nic_setting() == "declined";
}

bool nic_device_memory() {
  return nic_setting() == "1";
}

integrations::testing::RankDevice device_of(int rank) {
#ifdef PROXYEP_TEST_CUDA_DEVICE
  (void)rank;  // the Buffer's stream and the caller's: two streams of device 0
  return {std::make_shared<gpu_side::cuda::CudaDevice>(0),
          std::make_shared<gpu_side::cuda::CudaDevice>(0)};
#else
  device::SimulatedDeviceOptions options =
      rank == 0 ? device::SimulatedDeviceOptions{.operation_delay = std::chrono::milliseconds(5)}
                : device::SimulatedDeviceOptions{.defer_until_synchronize = true};
  options.nic_reads_device_memory = nic_reads();
  auto buffer = std::make_shared<device::SimulatedDevice>(options);
  return {buffer, buffer->another_stream()};
#endif
}

control::Bootstrap::Options launched() {
  return control::Bootstrap::options_for(control::LaunchEnv::from_environment());
}

int ranks_per_node() {
  const char* value = std::getenv("PROXYEP_TEST_RANKS_PER_NODE");
  return value != nullptr ? std::atoi(value) : 1;
}

}  // namespace

// Rows eager with the records, as by default.
TEST_CASE("normal mode with device tensors and eager rows") {
  integrations::testing::run_device_buffer_rank(
      ranks_per_node(), launched(), device_of, integrations::testing::kTokens, nic_device_memory());
}

// Rows in chunks through a Buffer sized for 4 tokens: every slot reused within a call.
TEST_CASE("normal mode with device tensors in many chunks") {
  params::ep_eager_bytes.set(0);
  integrations::testing::run_device_buffer_rank(ranks_per_node(), launched(), device_of, 4,
                                                nic_device_memory());
  params::ep_eager_bytes.reset();
}

TEST_CASE("low-latency mode with device tensors") {
  integrations::testing::ll::run_device_ll_rank(ranks_per_node(), launched(), device_of,
                                                nic_device_memory());
}

// Captured into graphs (device_ll_captured_case.hpp), launched three rounds with new inputs
// and three times back to back; across nodes the steps' writes go through the proxies (the
// node daemons': proxy/session/proxy_host_daemon.hpp), counted in signal words. The Buffer's stream
// captures; or the caller's, which the Buffer's joins, with hooks and a zero_copy combine.
TEST_CASE("low-latency calls captured into graphs") {
  integrations::testing::ll::run_captured_ll_rank(launched(), device_of, false, false, false,
                                                  ranks_per_node());
}

TEST_CASE("low-latency calls captured into graphs with hooks in the caller's capture") {
  integrations::testing::ll::run_captured_ll_rank(launched(), device_of, true, true, true,
                                                  ranks_per_node());
}

#ifdef PROXYEP_TEST_CUDA_DEVICE
int main(int argc, char** argv) {
  if (!testing::cuda_device_present()) return testing::kSkipExitCode;
  doctest::Context context(argc, argv);
  return context.run();
}
#endif
