// A device that faults in the middle of a call over the fabric (ranks as threads, reorder shim):
// rank 1's device stream fails its first descriptor push (SimulatedDeviceOptions::fail_operation),
// so its first writes to rank 0 never leave. Neither rank may hang: rank 1's call fails naming
// the device's fault as soon as it waits (the wait drives the stream first), rank 0's naming
// rank 1 (at its deadline, or when a write to the departed rank fails); both processes live on,
// and each Buffer goes without hanging.
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"
#include "tests/unit/integrations/device_test_tensors.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
namespace ep = gpu_side::ep;
namespace device = gpu_side::device;
using integrations::testing::error_of;
using integrations::testing::require_mentions;
using integrations::testing::upload;

namespace {

constexpr int kRanks = 2;

void run_rank(control::Bootstrap::Options options) {
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  device::SimulatedDeviceOptions faulty;
  if (me == 1) faulty.fail_operation = "ring_push";
  auto dev = std::make_shared<device::SimulatedDevice>(faulty);
  ep::WorkloadOptions w;
  w.shape = {kRanks, 1, 4 * kRanks};
  w.num_tokens = 16;
  w.hidden = 256;
  w.topk = 2;
  w.seed = 3;
  const ep::RankInputs mine = ep::make_rank_inputs(w, me);
  const ep::DispatchLayout layout = ep::compute_dispatch_layout(mine.topk_idx, w.shape);
  BufferOptions o;
  o.ranks_per_node = 1;
  o.num_nvl_bytes = Buffer::nvl_bytes_hint(w.num_tokens, w.hidden * 2, w.topk, kRanks);
  o.num_rdma_bytes = Buffer::rdma_bytes_hint(w.num_tokens, w.hidden * 2, w.topk, kRanks, 1);
  o.device = dev;
  Buffer buffer(*boot, o);
  const std::string error = error_of([&] {
    buffer.dispatch({.x = upload(*dev, mine.x),
                     .num_tokens_per_rank = upload(*dev, layout.num_tokens_per_rank),
                     .is_token_in_rank = upload(*dev, layout.is_token_in_rank),
                     .num_tokens_per_expert = upload(*dev, layout.num_tokens_per_expert),
                     .topk_idx = upload(*dev, mine.topk_idx),
                     .topk_weights = upload(*dev, mine.topk_weights)});
  });
  if (me == 1) {
    require_mentions(error, "ring_push: a fault injected");
  } else {
    // Rank 1's record or chunks never came (its first push failed, and once it failed it left
    // with writes unsent), or a write to it failed as it left: either way rank 1 is named.
    require(
        error.find("rank 1") != std::string::npos || error.find("rank(s) 1") != std::string::npos,
        "test", "rank 0's error does not name rank 1: '{}'", error);
  }
  // No destroy(): its barrier would wait for the other rank's failure; the destructor settles
  // what it can and logs the rest.
}

}  // namespace

TEST_CASE("a device that faults mid-call over the fabric: both ranks fail, neither hangs") {
  params::ep_timeout_ms.set(3000);
  integrations::testing::run_buffer_ranks(kRanks, true, run_rank);
  params::ep_timeout_ms.reset();
}
