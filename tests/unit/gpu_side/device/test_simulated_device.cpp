// The host-simulated device (gpu_side/device/simulated_device.hpp): the checks that make it
// worth running backend code on in CI. Each case is a wiring mistake a GPU build would make
// silently (garbage, a fault, a race) and the simulation must refuse loudly.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/workload.hpp"
#include "tests/unit/gpu_side/device/device_ring_cases.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using device::EpKernels;
using device::SimulatedDevice;
using device::SimulatedDeviceOptions;
using namespace std::chrono_literals;

namespace {

using testing::device_signal::error_of;

// Host memory the device may reach once registered: page-aligned, like an arena mapping.
struct HostPages {
  explicit HostPages(size_t bytes) : bytes(bytes) {
    memory = static_cast<std::byte*>(
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    REQUIRE(memory != MAP_FAILED);
  }
  ~HostPages() { ::munmap(memory, bytes); }
  std::byte* memory;
  size_t bytes;
};

}  // namespace

TEST_CASE("simulated device: bytes go to device memory and back in stream order") {
  SimulatedDevice dev;
  auto memory = dev.allocate(1000);
  std::vector<uint8_t> in(1000), out(1000, 0);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<uint8_t>(i * 13);
  dev.copy(memory.get(), in.data(), in.size());
  dev.fill(memory.get() + 10, 0xab, 5);
  dev.copy(out.data(), memory.get(), out.size());
  dev.synchronize("test", 10s);
  for (size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    CHECK(out[i] == (i >= 10 && i < 15 ? 0xab : in[i]));
  }
  CHECK(dev.operations_run() == 3);
}

TEST_CASE("simulated device: memory is released in stream order and counted") {
  SimulatedDevice dev;
  const uint64_t before = dev.device_bytes_in_use();
  {
    auto memory = dev.allocate(3 * 4096 + 1);
    CHECK(dev.device_bytes_in_use() == before + 4 * 4096);
  }
  dev.synchronize("test", 10s);
  CHECK(dev.device_bytes_in_use() == before);
}

TEST_CASE("simulated device: a deferred stream shows a read before synchronize() as stale") {
  SimulatedDevice dev(SimulatedDeviceOptions{.defer_until_synchronize = true});
  HostPages pages(4096);
  void* reachable = dev.register_host(pages.memory, pages.bytes);
  dev.fill(reachable, 0x5a, 16);
  std::this_thread::sleep_for(20ms);  // an eager stream would have run it by now
  CHECK(pages.memory[0] == std::byte{0});
  dev.synchronize("test", 10s);
  CHECK(pages.memory[0] == std::byte{0x5a});
  dev.unregister_host(pages.memory);
}

TEST_CASE("simulated device: the host sees an event reached only once the work before it ran") {
  SimulatedDevice dev(SimulatedDeviceOptions{.defer_until_synchronize = true});
  HostPages pages(4096);
  void* reachable = dev.register_host(pages.memory, pages.bytes);
  dev.fill(reachable, 0x5a, 16);
  auto filled = dev.record();
  std::this_thread::sleep_for(20ms);  // an eager stream would have run it by now
  CHECK_FALSE(dev.reached(*filled, "test"));
  CHECK(pages.memory[0] == std::byte{0});
  dev.wait_for(*filled, "test", 10s);  // runs the deferred queue
  CHECK(dev.reached(*filled, "test"));
  CHECK(pages.memory[0] == std::byte{0x5a});
  dev.unregister_host(pages.memory);
}

TEST_CASE("simulated device: the host waits for its own stream's events, up to a deadline") {
  SimulatedDevice dev;
  auto stalled = dev.another_stream({.defer_until_synchronize = true});
  CHECK(error_of([&] {
          dev.wait_for(*stalled->record(), "test", 1s);
        }).find("test: the host waits only for an event this stream recorded") !=
        std::string::npos);
  // This stream waits for the stalled one, so an event after that is not reached in time.
  dev.wait_event(stalled->record(), 5s);
  auto late = dev.record();
  CHECK(error_of([&] {
          dev.wait_for(*late, "combine", 50ms);
        }).find("combine: the simulated device's stream has not reached the event after 50 ms") !=
        std::string::npos);
  stalled->synchronize("test", 5s);
  dev.wait_for(*late, "test", 5s);
}

TEST_CASE("simulated device: get_dispatch_layout's kernel twin equals the host layout") {
  SimulatedDevice dev;
  ep::WorkloadOptions options;
  options.shape = ep::EpShape{16, 4, 64};
  options.num_tokens = 45;
  options.hidden = 128;
  options.topk = 6;
  options.drop_fraction = 0.1;
  const ep::RankInputs inputs = ep::make_rank_inputs(options, 3);
  const ep::DispatchLayout want = ep::compute_dispatch_layout(inputs.topk_idx, options.shape);

  const int64_t tokens = inputs.topk_idx.rows();
  auto topk = dev.allocate(inputs.topk_idx.bytes());
  auto per_rank = dev.allocate(16 * 4), per_node = dev.allocate(4 * 4),
       per_expert = dev.allocate(64 * 4),
       in_rank = dev.allocate(static_cast<uint64_t>(tokens) * 16);
  dev.copy(topk.get(), inputs.topk_idx.raw(), inputs.topk_idx.bytes());
  queue_kernel(dev, &EpKernels::dispatch_layout,
               {.topk_idx = reinterpret_cast<const int64_t*>(topk.get()),
                .num_tokens = tokens,
                .topk = 6,
                .shape = options.shape,
                .tokens_per_rank = reinterpret_cast<int32_t*>(per_rank.get()),
                .tokens_per_node = reinterpret_cast<int32_t*>(per_node.get()),
                .tokens_per_expert = reinterpret_cast<int32_t*>(per_expert.get()),
                .is_token_in_rank = reinterpret_cast<bool*>(in_rank.get())});
  std::vector<int32_t> got_rank(16), got_node(4), got_expert(64);
  std::vector<uint8_t> got_in_rank(static_cast<size_t>(tokens) * 16);
  dev.copy(got_rank.data(), per_rank.get(), 16 * 4);
  dev.copy(got_node.data(), per_node.get(), 4 * 4);
  dev.copy(got_expert.data(), per_expert.get(), 64 * 4);
  dev.copy(got_in_rank.data(), in_rank.get(), got_in_rank.size());
  dev.synchronize("test", 10s);
  CHECK(std::memcmp(got_rank.data(), want.num_tokens_per_rank.raw(), 16 * 4) == 0);
  CHECK(std::memcmp(got_node.data(), want.num_tokens_per_rdma_rank.raw(), 4 * 4) == 0);
  CHECK(std::memcmp(got_expert.data(), want.num_tokens_per_expert.raw(), 64 * 4) == 0);
  CHECK(std::memcmp(got_in_rank.data(), want.is_token_in_rank.raw(), got_in_rank.size()) == 0);
}

TEST_CASE("simulated device: the low-latency routing runs on device memory, as its twin") {
  SimulatedDevice dev;
  const int64_t tokens = 37;
  const int topk = 5;
  const int32_t experts = 24;
  std::vector<int64_t> idx(static_cast<size_t>(tokens * topk));
  for (size_t i = 0; i < idx.size(); ++i)  // hot experts 0 and 7, drops, one bad value
    idx[i] = i % 11 == 3 ? -1 : i % 3 == 0 ? 7 : static_cast<int64_t>((i * 5) % experts);
  idx[17] = 99;
  std::vector<int32_t> want_counts(experts), want_positions(idx.size());
  int32_t want_invalid = 0;
  ep::ll_route_on_host({.topk_idx = idx.data(),
                        .num_tokens = tokens,
                        .topk = topk,
                        .num_experts = experts,
                        .counts = want_counts.data(),
                        .positions = want_positions.data(),
                        .invalid = &want_invalid});
  REQUIRE(want_invalid == 1);

  auto topk_idx = dev.allocate(8 * idx.size()), counts = dev.allocate(4ull * experts),
       positions = dev.allocate(4 * idx.size()), invalid = dev.allocate(4);
  dev.copy(topk_idx.get(), idx.data(), 8 * idx.size());
  const ep::LlRouteParams params{.topk_idx = reinterpret_cast<const int64_t*>(topk_idx.get()),
                                 .num_tokens = tokens,
                                 .topk = topk,
                                 .num_experts = experts,
                                 .counts = reinterpret_cast<int32_t*>(counts.get()),
                                 .positions = reinterpret_cast<int32_t*>(positions.get()),
                                 .invalid = reinterpret_cast<int32_t*>(invalid.get())};
  queue_kernel(dev, &EpKernels::ll_route, params);
  std::vector<int32_t> got_counts(experts), got_positions(idx.size());
  int32_t got_invalid = -1;
  dev.copy(got_counts.data(), counts.get(), 4ull * experts);
  dev.copy(got_positions.data(), positions.get(), 4 * idx.size());
  dev.copy(&got_invalid, invalid.get(), 4);
  dev.synchronize("test", 10s);
  CHECK(got_counts == want_counts);
  CHECK(got_positions == want_positions);
  CHECK(got_invalid == 1);

  // Outputs in plain host memory, or sizes no kernel takes: refused before anything is queued.
  std::vector<int32_t> host_positions(idx.size());
  ep::LlRouteParams stray = params;
  stray.positions = host_positions.data();
  CHECK(error_of([&] { queue_kernel(dev, &EpKernels::ll_route, stray); }).find("positions") !=
        std::string::npos);
  ep::LlRouteParams bad = params;
  bad.topk = 0;
  CHECK(error_of([&] { queue_kernel(dev, &EpKernels::ll_route, bad); }).find("ll_route: topk") !=
        std::string::npos);
  dev.synchronize("test", 10s);  // still healthy
}

TEST_CASE("simulated device: the routed pack places messages as the host protocol sends them") {
  // 3 ranks of 4 experts; each rank's messages grouped by local expert, tokens ascending, one
  // slot after another in one allocation. The expected slots are built here message by message.
  SimulatedDevice dev;
  const int64_t tokens = 21;
  const int topk = 3, local = 4, ranks = 3, experts = local * ranks;
  const ep::LlFormat format{.hidden = 256, .fp8 = false};
  const uint64_t message = format.message_bytes();
  std::vector<int64_t> idx(static_cast<size_t>(tokens * topk));
  for (size_t i = 0; i < idx.size(); ++i)
    idx[i] = i % 7 == 2 ? -1 : static_cast<int64_t>((i * 7 + i / 5) % experts);
  std::vector<uint16_t> x(static_cast<size_t>(tokens) * format.hidden);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<uint16_t>(0x3c00 + i % 977);

  std::vector<std::vector<std::byte>> want(ranks);
  for (int d = 0; d < ranks; ++d)
    for (int le = 0; le < local; ++le)
      for (size_t i = 0; i < idx.size(); ++i) {
        if (idx[i] != d * local + le) continue;
        const auto token = static_cast<int32_t>(i / topk);
        std::vector<std::byte> one(message);
        ep::ll_pack_message(format, x.data() + token * format.hidden, token, one.data(),
                            ep::HostLanes{});
        want[d].insert(want[d].end(), one.begin(), one.end());
      }
  uint64_t total = 0;
  for (const auto& w : want)
    total += w.size();

  auto topk_d = dev.allocate(8 * idx.size()), x_d = dev.allocate(2 * x.size()),
       counts_d = dev.allocate(4ull * experts), positions_d = dev.allocate(4 * idx.size()),
       invalid_d = dev.allocate(4), slots_d = dev.allocate(total),
       table_d = dev.allocate(sizeof(std::byte*) * ranks);
  std::vector<std::byte*> table(ranks);
  for (int d = 0, at = 0; d < ranks; at += static_cast<int>(want[d].size()), ++d)
    table[d] = slots_d.get() + at;
  dev.copy(topk_d.get(), idx.data(), 8 * idx.size());
  dev.copy(x_d.get(), x.data(), 2 * x.size());
  dev.copy(table_d.get(), table.data(), sizeof(std::byte*) * ranks);
  dev.fill(slots_d.get(), 0x5a, total);
  const auto* topk_idx = reinterpret_cast<const int64_t*>(topk_d.get());
  auto* counts = reinterpret_cast<int32_t*>(counts_d.get());
  auto* positions = reinterpret_cast<int32_t*>(positions_d.get());
  queue_kernel(dev, &EpKernels::ll_route,
               {.topk_idx = topk_idx,
                .num_tokens = tokens,
                .topk = topk,
                .num_experts = experts,
                .counts = counts,
                .positions = positions,
                .invalid = reinterpret_cast<int32_t*>(invalid_d.get())});
  ep::LlPackRoutedParams pack{.format = format,
                              .x = reinterpret_cast<const uint16_t*>(x_d.get()),
                              .topk_idx = topk_idx,
                              .positions = positions,
                              .counts = counts,
                              .slots = reinterpret_cast<std::byte* const*>(table_d.get()),
                              .num_tokens = tokens,
                              .topk = topk,
                              .num_experts = experts,
                              .local_experts = local};
  queue_kernel(dev, &EpKernels::ll_pack_routed, pack);
  std::vector<std::byte> got(total);
  dev.copy(got.data(), slots_d.get(), total);
  dev.synchronize("test", 10s);
  for (int d = 0, at = 0; d < ranks; at += static_cast<int>(want[d].size()), ++d)
    CHECK(std::memcmp(got.data() + at, want[d].data(), want[d].size()) == 0);

  // A slot table entry in plain host memory fails the stream, naming the message.
  std::vector<std::byte> stray(total);
  table[1] = stray.data();
  dev.copy(table_d.get(), table.data(), sizeof(std::byte*) * ranks);
  queue_kernel(dev, &EpKernels::ll_pack_routed, pack);
  CHECK(error_of([&] { dev.synchronize("test", 10s); }).find("ll_pack_routed: message") !=
        std::string::npos);
}

TEST_CASE("simulated device: the routed combine finds every row by the routing, as its twin") {
  // 2 ranks of 3 experts, hidden 128: the routing and the rows sent back in device memory; the
  // result must equal the twin's on host copies of the same bytes.
  SimulatedDevice dev;
  const int64_t tokens = 9;
  const int topk = 4, local = 3, ranks = 2, experts = local * ranks;
  const uint32_t hidden = 128;
  std::vector<int64_t> idx(static_cast<size_t>(tokens * topk));
  for (size_t i = 0; i < idx.size(); ++i)
    idx[i] = i % 5 == 4 ? -1 : static_cast<int64_t>((i * 5 + i / 3) % experts);
  std::vector<int32_t> counts(experts), positions(idx.size());
  int32_t invalid = 0;
  ep::ll_route_on_host({.topk_idx = idx.data(),
                        .num_tokens = tokens,
                        .topk = topk,
                        .num_experts = experts,
                        .counts = counts.data(),
                        .positions = positions.data(),
                        .invalid = &invalid});
  const auto rows_back = static_cast<uint64_t>(tokens * topk);  // room for every selection
  std::vector<uint16_t> back(ranks * rows_back * hidden);
  for (size_t i = 0; i < back.size(); ++i)
    back[i] = static_cast<uint16_t>(0x3c00 + i % 611);
  std::vector<float> weights(idx.size());
  for (size_t i = 0; i < weights.size(); ++i)
    weights[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  std::vector<const uint16_t*> from_host = {back.data(), back.data() + rows_back * hidden};
  std::vector<uint16_t> want(static_cast<size_t>(tokens) * hidden);
  ep::ll_combine_routed_on_host({.topk_idx = idx.data(),
                                 .positions = positions.data(),
                                 .counts = counts.data(),
                                 .from = from_host.data(),
                                 .weights = weights.data(),
                                 .out = want.data(),
                                 .num_tokens = tokens,
                                 .topk = topk,
                                 .num_experts = experts,
                                 .local_experts = local,
                                 .hidden = hidden});

  auto topk_d = dev.allocate(8 * idx.size()), positions_d = dev.allocate(4 * idx.size()),
       counts_d = dev.allocate(4ull * experts), back_d = dev.allocate(2 * back.size()),
       from_d = dev.allocate(sizeof(void*) * ranks), weights_d = dev.allocate(4 * weights.size()),
       out_d = dev.allocate(2 * want.size());
  dev.copy(topk_d.get(), idx.data(), 8 * idx.size());
  dev.copy(positions_d.get(), positions.data(), 4 * idx.size());
  dev.copy(counts_d.get(), counts.data(), 4ull * experts);
  dev.copy(back_d.get(), back.data(), 2 * back.size());
  dev.copy(weights_d.get(), weights.data(), 4 * weights.size());
  const auto* back_rows = reinterpret_cast<const uint16_t*>(back_d.get());
  std::vector<const uint16_t*> from = {back_rows, back_rows + rows_back * hidden};
  dev.copy(from_d.get(), from.data(), sizeof(void*) * ranks);
  const ep::LlCombineRoutedParams params{
      .topk_idx = reinterpret_cast<const int64_t*>(topk_d.get()),
      .positions = reinterpret_cast<const int32_t*>(positions_d.get()),
      .counts = reinterpret_cast<const int32_t*>(counts_d.get()),
      .from = reinterpret_cast<const uint16_t* const*>(from_d.get()),
      .weights = reinterpret_cast<const float*>(weights_d.get()),
      .out = reinterpret_cast<uint16_t*>(out_d.get()),
      .num_tokens = tokens,
      .topk = topk,
      .num_experts = experts,
      .local_experts = local,
      .hidden = hidden};
  queue_kernel(dev, &EpKernels::ll_combine_routed, params);
  std::vector<uint16_t> got(want.size());
  dev.copy(got.data(), out_d.get(), 2 * got.size());
  dev.synchronize("test", 10s);
  CHECK(got == want);

  // The check of a combine's topk_idx against its dispatch's, on the device.
  auto other_d = dev.allocate(8 * idx.size()), mismatches_d = dev.allocate(4);
  std::vector<int64_t> other = idx;
  other[3] = (other[3] + 1) % experts;
  other[30] = -1 == other[30] ? 0 : -1;
  dev.copy(other_d.get(), other.data(), 8 * other.size());
  const ep::MismatchParams compare{.a = reinterpret_cast<const int64_t*>(topk_d.get()),
                                   .b = reinterpret_cast<const int64_t*>(other_d.get()),
                                   .count = static_cast<int64_t>(idx.size()),
                                   .mismatches = reinterpret_cast<int32_t*>(mismatches_d.get())};
  queue_kernel(dev, &EpKernels::count_mismatches, compare);
  int32_t mismatches = -1;
  dev.copy(&mismatches, mismatches_d.get(), 4);
  dev.synchronize("test", 10s);
  CHECK(mismatches == 2);
  ep::MismatchParams stray_compare = compare;
  stray_compare.b = other.data();
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::count_mismatches, stray_compare);
        }).find("count_mismatches: b") != std::string::npos);

  // A `from` entry in plain host memory fails the stream, naming the row.
  from[1] = from_host[1];
  dev.copy(from_d.get(), from.data(), sizeof(void*) * ranks);
  queue_kernel(dev, &EpKernels::ll_combine_routed, params);
  CHECK(error_of([&] { dev.synchronize("test", 10s); }).find("ll_combine_routed: row") !=
        std::string::npos);
}

TEST_CASE("simulated device: a read-back larger than max_read_back_bytes is refused") {
  SimulatedDevice dev({.max_read_back_bytes = 16});
  auto memory = dev.allocate(64);
  std::array<std::byte, 64> host{};
  dev.copy(memory.get(), host.data(), 64);  // to the device: no limit
  dev.copy(host.data(), memory.get(), 16);  // a few counts back: allowed
  CHECK(error_of([&] {
          dev.copy(host.data(), memory.get(), 17);
        }).find("copy: 17 bytes from device memory into plain host memory") != std::string::npos);
  dev.synchronize("test", 10s);  // refused before it was queued: the stream is healthy
}

// "Host code that touches device memory faults" is its own test (device_fault_main.cpp): it
// is skipped, visibly, where the CPU has no memory protection keys.

TEST_CASE("simulated device: an event orders a second stream after a slow first one") {
  SimulatedDevice dev;
  // The caller's stream: each operation starts 30 ms late, so a stream that does not wait for
  // its event reads the old bytes.
  auto caller = dev.another_stream({.operation_delay = 30ms});
  auto memory = caller->allocate(64);
  dev.fill(memory.get(), 0, 64);
  dev.synchronize("test", 5s);
  std::array<uint8_t, 64> written{}, read{};
  written.fill(7);
  caller->copy(memory.get(), written.data(), written.size());
  dev.wait_event(caller->record(), 5s);
  dev.copy(read.data(), memory.get(), read.size());
  dev.synchronize("test", 5s);
  CHECK(read == written);
  // One device: memory either stream allocated counts once, whichever stream frees it.
  CHECK(dev.device_bytes_in_use() == caller->device_bytes_in_use());
  caller->synchronize("test", 5s);
}

TEST_CASE("simulated device: an event never reached fails the waiting stream, naming it") {
  SimulatedDevice dev;
  auto stalled = dev.another_stream({.defer_until_synchronize = true});
  stalled->fill(stalled->allocate(8).get(), 0, 8);
  dev.wait_event(stalled->record(), 50ms);
  const std::string error = error_of([&] { dev.synchronize("after the caller", 5s); });
  CHECK(error.find("after the caller") != std::string::npos);
  CHECK(error.find("wait_event: the event was not reached within 50 ms") != std::string::npos);
  stalled->synchronize("test", 5s);
}

TEST_CASE("simulated device: an event of another device is refused") {
  SimulatedDevice one, other;
  const std::string error = error_of([&] { one.wait_event(other.record(), 1s); });
  CHECK(error.find("the event was not recorded on a stream of this device") != std::string::npos);
  other.synchronize("test", 5s);
}

TEST_CASE("simulated device: descriptors pushed into a ring in stream order") {
  namespace cases = testing::device_ring;
  // A quick stream, a slow one (a push that overtook the fill before it would show) and a
  // deferred one (nothing runs until the host waits; the consumer runs beside it).
  for (const SimulatedDeviceOptions options :
       {SimulatedDeviceOptions{}, SimulatedDeviceOptions{.operation_delay = 5ms},
        SimulatedDeviceOptions{.defer_until_synchronize = true}}) {
    CAPTURE(options.operation_delay.count());
    CAPTURE(options.defer_until_synchronize);
    CHECK(cases::push_in_stream_order_case(std::make_shared<SimulatedDevice>(options)) == "");
  }
  CHECK(cases::abandoned_case(std::make_shared<SimulatedDevice>()) == "");
}

TEST_CASE("simulated device: signal words order the stream with the host, with a deadline") {
  namespace cases = testing::device_signal;
  // A quick stream and a slow one (an operation that overtook the wait would show).
  for (const SimulatedDeviceOptions options :
       {SimulatedDeviceOptions{}, SimulatedDeviceOptions{.operation_delay = 5ms}}) {
    CAPTURE(options.operation_delay.count());
    CHECK(cases::wait_then_signal_case(std::make_shared<SimulatedDevice>(options)) == "");
  }
  CHECK(cases::timed_out_wait_case(std::make_shared<SimulatedDevice>()) == "");
  CHECK(cases::refused_words_case(std::make_shared<SimulatedDevice>()) == "");
}

TEST_CASE("simulated device: a word raised by another stream of the device releases the wait") {
  // A node peer's stream writes the word in device memory (its arena), this stream waits on it.
  SimulatedDevice dev;
  auto peer = dev.another_stream();
  const std::shared_ptr<std::byte[]> word_memory = dev.allocate(64);
  auto* word = reinterpret_cast<uint64_t*>(word_memory.get());
  peer->fill(word, 0, 8);
  peer->synchronize("test", 5s);
  std::array<uint8_t, 16> out{};
  const std::shared_ptr<std::byte[]> source = dev.allocate(out.size());
  dev.fill(source.get(), 3, out.size());
  dev.wait_value(word, 5, 10s, "peer word");
  dev.copy(out.data(), source.get(), out.size());
  const auto end = dev.record();
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(dev.reached(*end, "test"));
  peer->write_value(word, 5, "peer signal");
  dev.wait_for(*end, "test", 10s);
  CHECK(out[0] == 3);
  CHECK(out[15] == 3);
  peer->synchronize("test", 5s);
}

TEST_CASE("simulated device: ring pushes the device cannot make are refused") {
  namespace cases = testing::device_ring;
  SimulatedDevice dev;
  cases::OwnRing unregistered(8);
  CHECK(error_of([&] { dev.attach_ring(unregistered.ring); }).find("attach_ring: the ring at") !=
        std::string::npos);
  HostMemory single_memory = HostMemory::heap(Ring::bytes_for(8));
  const Ring single = Ring::create(single_memory.bytes(), 8, ProducerMode::single);
  CHECK(error_of([&] { dev.attach_ring(single); }).find("multi-producer rings only") !=
        std::string::npos);

  cases::OwnRing r(8);
  cases::Registered registered(dev, r.memory.bytes());
  auto producer = dev.attach_ring(r.ring);
  // Descriptors in plain host memory: a kernel cannot read them.
  const std::vector<Descriptor> host{cases::numbered(0)};
  CHECK(error_of([&] {
          dev.ring_push(*producer, host.data(), 1, 1s);
        }).find("ring_push: descriptors at") != std::string::npos);
  // Another stream is another producer: it cannot push through this one's state.
  auto other = dev.another_stream();
  const auto descriptors = cases::on_device(dev, host);
  CHECK(error_of([&] {
          other->ring_push(*producer, reinterpret_cast<const Descriptor*>(descriptors.get()), 1,
                           1s);
        }).find("the ring was not attached to this stream") != std::string::npos);
  dev.synchronize("test", 5s);
  CHECK(atomic(r.ring.header().producer.head).load() == 0);
}

TEST_CASE("simulated device: copy_runs reaches only device memory and registered host memory") {
  SimulatedDevice dev;
  auto memory = dev.allocate(64);
  std::vector<std::byte> host(64);
  const std::vector<ep::CopyRun> runs{{.to = memory.get(), .from = host.data(), .bytes = 64}};
  // The run table itself in plain host memory: refused at once.
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::copy_runs, {.runs = runs.data(), .num_runs = 1});
        }).find("copy_runs: runs at") != std::string::npos);
  // A run reading plain host memory: the stream fails, naming it.
  auto table = dev.allocate(sizeof(ep::CopyRun));
  dev.copy(table.get(), runs.data(), sizeof(ep::CopyRun));
  queue_kernel(dev, &EpKernels::copy_runs,
               {.runs = reinterpret_cast<const ep::CopyRun*>(table.get()), .num_runs = 1});
  CHECK(error_of([&] { dev.synchronize("test", 5s); }).find("copy_runs: a run's source at") !=
        std::string::npos);
}

TEST_CASE("simulated device: shared memory another device opens is the same bytes elsewhere") {
  SimulatedDevice owner, peer;
  device::SharedMemory shared = owner.allocate_shared(3 * 4096);
  REQUIRE(shared.memory != nullptr);
  CHECK(shared.bytes == 3 * 4096);
  CHECK(shared.handle.size() <= device::kSharedHandleBytes);
  auto opened = peer.open_shared(shared.handle, shared.bytes, "test");
  REQUIRE(opened != nullptr);
  // Its own mapping: an address of the owner's would be wrong in another process.
  CHECK(opened.get() != shared.memory.get());
  // The peer's kernels write through its mapping, the owner's read through its own.
  std::vector<uint8_t> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<uint8_t>(i * 7 + 1);
  peer.copy(opened.get() + 4096, in.data(), in.size());
  peer.synchronize("test", 10s);
  owner.copy(out.data(), shared.memory.get() + 4096, out.size());
  owner.synchronize("test", 10s);
  CHECK(out == in);
  // Each device reaches only its own mapping; past the end is refused as for any allocation.
  CHECK(error_of([&] { owner.fill(opened.get(), 0, 16); }).find("fill: destination") !=
        std::string::npos);
  CHECK(error_of([&] { peer.fill(opened.get() + 3 * 4096 - 8, 0, 16); }).find("(16 bytes)") !=
        std::string::npos);
  // Counted as device memory of each; closed (unreachable) once its last owner is gone.
  const uint64_t before = peer.device_bytes_in_use();
  std::byte* address = opened.get();
  opened.reset();
  CHECK_FALSE(error_of([&] { peer.fill(address, 0, 16); }).empty());
  peer.synchronize("test", 10s);
  CHECK(peer.device_bytes_in_use() == before - 3 * 4096);
}

TEST_CASE("simulated device: a shared handle that is not one, or too small, is refused") {
  SimulatedDevice owner, peer;
  device::SharedMemory shared = owner.allocate_shared(4096);
  CHECK(error_of([&] {
          (void)peer.open_shared(shared.handle, 2 * 4096, "test");
        }).find("shared 4096 bytes, 8192 are needed") != std::string::npos);
  std::vector<uint8_t> foreign = shared.handle;
  foreign[0] ^= 0xff;  // another kind's magic
  CHECK(error_of([&] {
          (void)peer.open_shared(foreign, 4096, "test");
        }).find("not a simulated device's") != std::string::npos);
  CHECK_FALSE(error_of([&] { (void)peer.open_shared({}, 4096, "test"); }).empty());
}

// The node daemon's view (client_device_memory.hpp): the memfd that came with the handle,
// mapped untagged, as a NIC reaches GPU memory. What the NIC writes there, the owner's kernels
// read; what they write, the NIC reads.
TEST_CASE("simulated device: the NIC's view of shared memory is the same bytes, any thread's") {
  SimulatedDevice owner({.nic_reads_device_memory = true});
  device::SharedMemory shared = owner.allocate_shared(2 * 4096);
  REQUIRE(shared.fd >= 0);
  CHECK(shared.nic_reads);
  device::NicMemory nic = SimulatedDevice::open_for_nic(shared.handle, shared.fd, 2 * 4096, "test");
  REQUIRE(nic.memory != nullptr);
  CHECK(nic.bytes == 2 * 4096);
  CHECK(nic.registers_as_host);
  CHECK(nic.memory.get() != shared.memory.get());
  std::vector<uint8_t> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<uint8_t>(i * 5 + 3);
  std::memcpy(nic.memory.get() + 4096, in.data(), in.size());  // this thread is the NIC
  owner.copy(out.data(), shared.memory.get() + 4096, out.size());
  owner.synchronize("test", 10s);
  CHECK(out == in);
  owner.fill(shared.memory.get(), 0x5a, 16);
  owner.synchronize("test", 10s);
  CHECK(std::to_integer<int>(nic.memory[15]) == 0x5a);
  // The view keeps the pages once the owner is gone (a client that died mid-call).
  shared.memory.reset();
  CHECK(std::to_integer<int>(nic.memory[0]) == 0x5a);
}

TEST_CASE("simulated device: the NIC's view is refused without leave, a descriptor or bytes") {
  SimulatedDevice plain, nic_owner({.nic_reads_device_memory = true});
  device::SharedMemory no_nic = plain.allocate_shared(4096);
  CHECK(error_of([&] {
          (void)SimulatedDevice::open_for_nic(no_nic.handle, no_nic.fd, 4096, "test");
        }).find("does not let a NIC reach") != std::string::npos);
  device::SharedMemory shared = nic_owner.allocate_shared(4096);
  CHECK(error_of([&] {
          (void)SimulatedDevice::open_for_nic(shared.handle, -1, 4096, "test");
        }).find("no descriptor came") != std::string::npos);
  CHECK(error_of([&] {
          (void)SimulatedDevice::open_for_nic(shared.handle, shared.fd, 2 * 4096, "test");
        }).find("shared 4096 bytes, 8192 are needed") != std::string::npos);
  std::vector<uint8_t> foreign = shared.handle;
  foreign[0] ^= 0xff;
  CHECK(error_of([&] {
          (void)SimulatedDevice::open_for_nic(foreign, shared.fd, 4096, "test");
        }).find("not a simulated device's") != std::string::npos);
}
