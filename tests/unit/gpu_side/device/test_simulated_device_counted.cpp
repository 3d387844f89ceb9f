// The counted low-latency unpack (gpu_side/ep/ll_counted.hpp) on the host-simulated device:
// on device memory it equals its CPU twin, and what the kernel only tolerates (counts no sink
// holds, a source with messages and no slot, places the device cannot reach) fails the stream;
// likewise the way back (ll_return_counted).
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using device::EpKernels;
using device::SimulatedDevice;
using namespace std::chrono_literals;

using testing::device_signal::error_of;

namespace {

// A counted unpack on a simulated device: 2 sources' messages (4 each, in registered host
// memory, one slot after the other) into 2 experts of `rows` rows each (device memory), by
// `counts` (source-major, uploaded); `from_plain`: source 1's slot entry points into plain host
// memory instead. Returns synchronize()'s error ("" when the stream ran), the outputs in `got`
// and, when it ran, the twin's in `want`.
struct CountedRun {
  std::vector<std::byte> x;
  std::vector<int32_t> src_info, recv_count;
  std::vector<int64_t> layout_range;
};

std::string run_counted(std::vector<int32_t> counts, int64_t rows, bool from_plain, bool no_slot,
                        CountedRun& got, CountedRun& want) {
  SimulatedDevice dev;
  ep::LlFormat f;
  f.hidden = 128;
  f.fp8 = false;
  const uint64_t message = f.message_bytes();
  HostMemory slot_memory = HostMemory::heap(8 * message);  // registered: the sources' slots
  std::byte* slots = slot_memory.bytes().data();
  std::vector<std::byte> plain(8 * message);
  for (uint64_t i = 0; i < 8 * message; ++i)
    slots[i] = plain[i] = static_cast<std::byte>(i * 7 + i / message);
  for (int32_t m = 0; m < 8; ++m) {
    std::memcpy(slots + m * message, &m, 4);
    std::memcpy(plain.data() + m * message, &m, 4);
  }
  dev.register_host(slots, slot_memory.bytes().size());
  const uint64_t x_bytes = 2 * rows * f.payload_bytes();
  auto x = dev.allocate(x_bytes), info = dev.allocate(8 * rows), recv = dev.allocate(8),
       range = dev.allocate(32), counts_d = dev.allocate(16), from_d = dev.allocate(16),
       sinks_d = dev.allocate(2 * sizeof(ep::LlExpertSink));
  dev.fill(x.get(), 0xee, x_bytes);
  dev.fill(info.get(), 0xee, 8 * rows);
  std::vector<const std::byte*> from = {
      slots, from_plain ? plain.data() + 4 * message : slots + 4 * message};
  if (no_slot) from[1] = nullptr;
  std::vector<ep::LlExpertSink> sinks;
  for (int e = 0; e < 2; ++e)
    sinks.push_back({.x = x.get() + e * rows * f.payload_bytes(),
                     .scale_stride = rows,
                     .src_info = reinterpret_cast<int32_t*>(info.get()) + e * rows});
  dev.copy(counts_d.get(), counts.data(), 16);
  dev.copy(from_d.get(), from.data(), 16);
  dev.copy(sinks_d.get(), sinks.data(), sinks.size() * sizeof(ep::LlExpertSink));
  queue_kernel(dev, &EpKernels::ll_unpack_counted,
               {.format = f,
                .counts = reinterpret_cast<const int32_t*>(counts_d.get()),
                .from = reinterpret_cast<const std::byte* const*>(from_d.get()),
                .sinks = reinterpret_cast<const ep::LlExpertSink*>(sinks_d.get()),
                .recv_count = reinterpret_cast<int32_t*>(recv.get()),
                .layout_range = reinterpret_cast<int64_t*>(range.get()),
                .ranks = 2,
                .local_experts = 2,
                .rows_per_expert = rows});
  got.x.resize(x_bytes);
  got.src_info.resize(2 * rows);
  got.recv_count.resize(2);
  got.layout_range.resize(4);
  dev.copy(got.x.data(), x.get(), x_bytes);
  dev.copy(got.src_info.data(), info.get(), 8 * rows);
  dev.copy(got.recv_count.data(), recv.get(), 8);
  dev.copy(got.layout_range.data(), range.get(), 32);
  const std::string error = error_of([&] { dev.synchronize("counted", 5s); });
  dev.unregister_host(slots);
  if (!error.empty()) return error;  // counts the twin would read past the slots with
  // The twin on plain host copies of the same bytes.
  want.x.assign(x_bytes, std::byte{0xee});
  want.src_info.assign(2 * rows, static_cast<int32_t>(0xeeeeeeee));
  want.recv_count.resize(2);
  want.layout_range.resize(4);
  std::vector<ep::LlExpertSink> host_sinks;
  for (int e = 0; e < 2; ++e)
    host_sinks.push_back({.x = want.x.data() + e * rows * f.payload_bytes(),
                          .scale_stride = rows,
                          .src_info = want.src_info.data() + e * rows});
  const std::vector<const std::byte*> host_from = {plain.data(),
                                                   no_slot ? nullptr : plain.data() + 4 * message};
  ep::ll_unpack_counted_on_host({.format = f,
                                 .counts = counts.data(),
                                 .from = host_from.data(),
                                 .sinks = host_sinks.data(),
                                 .recv_count = want.recv_count.data(),
                                 .layout_range = want.layout_range.data(),
                                 .ranks = 2,
                                 .local_experts = 2,
                                 .rows_per_expert = rows});
  return "";
}

}  // namespace

TEST_CASE("simulated device: the counted unpack runs on device memory, as its twin") {
  CountedRun got, want;
  // Source 0: 1 message for expert 0, 3 for expert 1; source 1: 2 and 2.
  REQUIRE(run_counted({1, 3, 2, 2}, 8, false, false, got, want) == "");
  CHECK(got.x == want.x);
  CHECK(got.src_info == want.src_info);
  CHECK(got.recv_count == std::vector<int32_t>{3, 5});
  CHECK(got.layout_range == want.layout_range);
  CHECK(got.src_info[1] == 4);  // expert 0's second row: source 1's first message
}

TEST_CASE("simulated device: counts no sink holds, or slots it cannot reach, fail the stream") {
  CountedRun got, want;
  CHECK(run_counted({1, -1, 2, 2}, 8, false, false, got, want)
            .find("source 0 announced -1 messages for expert 1") != std::string::npos);
  CHECK(run_counted({3, 1, 2, 3}, 4, false, false, got, want)
            .find("expert 0 was announced 5 messages, its sink holds 4") != std::string::npos);
  CHECK(run_counted({1, 3, 2, 2}, 8, false, true, got, want)
            .find("source 1 announced messages but has no slot") != std::string::npos);
  CHECK(run_counted({1, 3, 2, 2}, 8, true, false, got, want)
            .find("ll_unpack_counted: source messages at") != std::string::npos);
  // A table in plain host memory is refused at once, naming it.
  SimulatedDevice dev;
  std::vector<int32_t> counts(4, 0);
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::ll_unpack_counted,
                       {.format = {.hidden = 128, .fp8 = false},
                        .counts = counts.data(),
                        .ranks = 2,
                        .local_experts = 2});
        }).find("ll_unpack_counted: counts at") != std::string::npos);
}

TEST_CASE(
    "simulated device: the way back runs on device memory; a layout past the blocks or "
    "the slot fails the stream") {
  // One expert of 4 rows, 2 sources: rows 0..1 from source 0, rows 2..3 from source 1.
  const uint32_t hidden = 8;
  auto run = [&](std::vector<int64_t> range, int64_t slot_rows, std::vector<uint16_t>& got) {
    SimulatedDevice dev;
    std::vector<uint16_t> x(4 * hidden);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<uint16_t>(i / hidden + 1);
    auto x_d = dev.allocate(2 * x.size()), range_d = dev.allocate(16),
         slots = dev.allocate(2 * 2 * 2 * hidden), to_d = dev.allocate(16);
    dev.fill(slots.get(), 0, 2 * 2 * 2 * hidden);
    std::vector<uint16_t*> to{reinterpret_cast<uint16_t*>(slots.get()),
                              reinterpret_cast<uint16_t*>(slots.get()) + 2 * hidden};
    dev.copy(x_d.get(), x.data(), 2 * x.size());
    dev.copy(range_d.get(), range.data(), 16);
    dev.copy(to_d.get(), to.data(), 16);
    queue_kernel(dev, &EpKernels::ll_return_counted,
                 {.layout_range = reinterpret_cast<const int64_t*>(range_d.get()),
                  .x = reinterpret_cast<const uint16_t*>(x_d.get()),
                  .to = reinterpret_cast<uint16_t* const*>(to_d.get()),
                  .ranks = 2,
                  .local_experts = 1,
                  .rows_per_expert = 4,
                  .slot_rows = slot_rows,
                  .hidden = hidden});
    got.assign(4 * hidden, 0);
    dev.copy(got.data(), slots.get(), 2 * got.size());
    return error_of([&] { dev.synchronize("test", 5s); });
  };
  std::vector<uint16_t> got;
  REQUIRE(run({2, (int64_t{2} << 32) | 2}, 2, got) == "");
  for (size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == i / hidden + 1);  // source 0's slot rows 1, 2; source 1's rows 3, 4
  CHECK(run({3, (int64_t{2} << 32) | 2}, 2, got)
            .find("source 0 is sent back 3 rows, its slot "
                  "holds 2") != std::string::npos);
  CHECK(run({2, (int64_t{3} << 32) | 2}, 2, got)
            .find("expert 0's rows 3..5 from source 1 are past its 4 rows") != std::string::npos);
}
