// GPU producer end to end: blocks x threads of a CUDA kernel push descriptors into a ring in
// mapped pinned host memory; this host thread consumes them and checks that every descriptor
// arrives exactly once and intact (the same encode on the GPU, the same decode here).
// Then the stream-ordered push of CudaDevice::ring_push (tests/unit/gpu_side/device/
// device_ring_cases.hpp, which the simulated device also runs).
// Exits 77 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is usable.
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "gpu_side/cuda/cuda_device.hpp"
#include "gpu_side/cuda/ring_selftest.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/pinned_memory.hpp"
#include "gpu_side/ring.hpp"

#include "tests/gpu/device_check.hpp"
#include "tests/unit/gpu_side/device/device_ring_cases.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace std::chrono_literals;

namespace {

struct Tally {
  uint64_t received = 0, corrupt = 0, wrong = 0, duplicate = 0;
};

void check_slot(const WireDescriptor& slot, const gpu_side::cuda::SelftestConfig& config,
                std::vector<bool>& seen, Tally& tally) {
  Descriptor d;
  if (decode(slot, d) != DecodeResult::ok) {
    ++tally.corrupt;
    return;
  }
  const uint64_t total = uint64_t{config.blocks} * config.per_block;
  if (d.cookie >= total) {
    ++tally.wrong;
    return;
  }
  const auto block = static_cast<uint32_t>(d.cookie / config.per_block);
  const Descriptor expected =
      gpu_side::cuda::selftest_descriptor(block, d.cookie % config.per_block, config.per_block);
  if (d.op != expected.op || d.flags != expected.flags || d.dst_rank != expected.dst_rank ||
      d.local_region != expected.local_region || d.remote_region != expected.remote_region ||
      d.src_offset != expected.src_offset || d.dst_offset != expected.dst_offset ||
      d.length != expected.length || d.imm != expected.imm) {
    ++tally.wrong;
    return;
  }
  if (seen[d.cookie]) {
    ++tally.duplicate;
    return;
  }
  seen[d.cookie] = true;
  ++tally.received;
}

int run(uint64_t capacity, const gpu_side::cuda::SelftestConfig& config) {
  auto memory = cuda_pinned_memory(Ring::bytes_for(capacity));
  Ring ring = Ring::create(memory.bytes(), capacity);
  RingConsumer consumer(ring);
  RingWaiter waiter(consumer, nullptr, {.timed_sleep = 5us});  // GPU: no doorbell
  gpu_side::cuda::RingSelftest selftest(memory.device(), capacity, config);
  const uint64_t total = uint64_t{config.blocks} * config.per_block;
  std::vector<bool> seen(total, false);
  Tally tally;
  std::vector<WireDescriptor> burst(64);
  const auto start = Deadline::Clock::now();
  selftest.launch();
  const Deadline deadline(60s);
  while (tally.received + tally.corrupt + tally.wrong + tally.duplicate < total) {
    if (waiter.wait(deadline) != Status::ok || consumer.health() != Status::ok) break;
    const size_t n = consumer.pop_burst(burst);
    for (size_t i = 0; i < n; ++i)
      check_slot(burst[i], config, seen, tally);
  }
  const double seconds = std::chrono::duration<double>(Deadline::Clock::now() - start).count();
  const uint64_t failures = selftest.finish();
  std::printf(
      "gpu ring: capacity %llu, %u blocks x %u threads, %llu descriptors: received %llu, corrupt "
      "%llu, wrong %llu, duplicate %llu, gave up %llu, health %s, %.2f M descriptors/s\n",
      static_cast<unsigned long long>(capacity), config.blocks, config.threads_per_block,
      static_cast<unsigned long long>(total), static_cast<unsigned long long>(tally.received),
      static_cast<unsigned long long>(tally.corrupt), static_cast<unsigned long long>(tally.wrong),
      static_cast<unsigned long long>(tally.duplicate), static_cast<unsigned long long>(failures),
      std::string(to_string(consumer.health())).c_str(),
      static_cast<double>(tally.received) / seconds / 1e6);
  const bool ok = tally.received == total && tally.corrupt == 0 && tally.wrong == 0 &&
                  tally.duplicate == 0 && failures == 0 && consumer.health() == Status::ok &&
                  !consumer.ready();
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  if (!proxyep::testing::cuda_device_present()) return proxyep::testing::kSkipExitCode;
  try {
    // Many laps of a small ring (threads wait for slots), then a large ring (pure throughput).
    int rc = run(256, {.blocks = 16, .threads_per_block = 128, .per_block = 4096});
    rc |= run(1 << 16, {.blocks = 132, .threads_per_block = 256, .per_block = 8192});
    namespace cases = gpu_side::testing::device_ring;
    for (const auto& [name, run_case] :
         {std::pair{"ring_push in stream order", &cases::push_in_stream_order_case},
          std::pair{"ring_push into a full ring", &cases::abandoned_case}}) {
      const std::string failure = run_case(std::make_shared<gpu_side::cuda::CudaDevice>(0));
      std::printf("%s %s %s\n", failure.empty() ? "ok  " : "FAIL", name, failure.c_str());
      rc |= failure.empty() ? 0 : 1;
    }
    std::printf("%s\n", rc == 0 ? "PASS" : "FAIL");
    return rc;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
