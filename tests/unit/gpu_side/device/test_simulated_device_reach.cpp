// The host-simulated device (gpu_side/device/simulated_device.hpp): the addresses it refuses.
// A kernel handed memory a GPU could not reach (plain host memory, past an allocation, freed,
// unaligned), directly or inside a table the kernel reads, fails naming what it read, the way a
// GPU build would fault or read garbage.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"

#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using device::EpKernels;
using device::SimulatedDevice;
using namespace std::chrono_literals;

namespace {

using testing::device_signal::error_of;

}  // namespace

TEST_CASE("simulated device: a plain host address handed to a kernel is refused, naming it") {
  SimulatedDevice dev;
  std::vector<std::byte> host(64);
  CHECK(error_of([&] { dev.fill(host.data(), 0, host.size()); }).find("fill: destination") !=
        std::string::npos);
  const std::array<int32_t, 2> tokens = {0, 1};
  ep::ChunkParams chunk;
  chunk.tokens = tokens.data();
  chunk.rows = 2;
  const std::string message =
      error_of([&] { queue_kernel(dev, &EpKernels::dispatch_chunk, chunk); });
  CHECK(message.find("dispatch_chunk: tokens") != std::string::npos);
  CHECK(message.find("neither device memory nor registered host memory") != std::string::npos);
  // Registered, the same host memory is fine.
  void* reachable = dev.register_host(host.data(), host.size());
  dev.fill(reachable, 7, host.size());
  dev.synchronize("test", 10s);
  CHECK(host[63] == std::byte{7});
  dev.unregister_host(host.data());
  CHECK(error_of([&] { dev.fill(host.data(), 0, 1); }).find("fill") != std::string::npos);
}

TEST_CASE("simulated device: an extent past the end of an allocation is refused") {
  SimulatedDevice dev;
  auto memory = dev.allocate(4096);
  CHECK(error_of([&] { dev.fill(memory.get() + 4000, 0, 200); }).find("(200 bytes)") !=
        std::string::npos);
}

TEST_CASE("simulated device: memory whose last owner is gone is unreachable at once") {
  SimulatedDevice dev;
  auto memory = dev.allocate(4096);
  std::byte* address = memory.get();
  memory.reset();
  CHECK_FALSE(error_of([&] { dev.fill(address, 0, 16); }).empty());
}

TEST_CASE("simulated device: a bad address inside a table fails the stream, stickily") {
  SimulatedDevice dev;
  // One token row routed to a sink whose x is plain host memory: the table is on the device,
  // so only the stream can see the mistake, and synchronize() reports it.
  ep::RowFormat format;
  format.hidden_bytes = 64;
  auto x = dev.allocate(64);
  auto send_head = dev.allocate(4);
  auto sinks = dev.allocate(sizeof(ep::RowSink));
  std::vector<std::byte> wrong(64);
  ep::RowSink sink;
  sink.x = wrong.data();
  sink.rank = 0;
  const int32_t head = 0;
  dev.copy(send_head.get(), &head, 4);
  dev.copy(sinks.get(), &sink, sizeof(sink));
  ep::DispatchParams params;
  params.input.x = x.get();
  params.input.format = format;
  params.input.shape = ep::EpShape{1, 1, 1};
  params.send_head = reinterpret_cast<const int32_t*>(send_head.get());
  params.sinks = reinterpret_cast<const ep::RowSink*>(sinks.get());
  params.num_tokens = 1;
  queue_kernel(dev, &EpKernels::dispatch_rows, params);
  // A host waiting for an event after it hears of the failure at once, not at its deadline.
  auto after = dev.record();
  const auto started = std::chrono::steady_clock::now();
  const std::string waited = error_of([&] { dev.wait_for(*after, "combine", 10s); });
  CHECK(waited.find("combine: the simulated device failed: dispatch_rows: sink x row") !=
        std::string::npos);
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  CHECK(error_of([&] {
          dev.reached(*after, "query");
        }).find("query: the simulated device failed") != std::string::npos);
  std::string message = error_of([&] { dev.synchronize("dispatch", 10s); });
  CHECK(message.find("dispatch: the simulated device failed: dispatch_rows: sink x row") !=
        std::string::npos);
  // Later work does not run; the failure is reported again.
  std::vector<std::byte> back(64, std::byte{1});
  dev.copy(back.data(), x.get(), 64);
  CHECK_FALSE(error_of([&] { dev.synchronize("again", 10s); }).empty());
  CHECK(back[0] == std::byte{1});
}

TEST_CASE("simulated device: a forwarder's heads and source indices must be device memory") {
  // One forwarder row (hierarchical internode): the row, its heads for 2 ranks of a node and the
  // source index it carries on. Read from the host, either fails the stream naming it.
  ep::RowFormat format;
  format.hidden_bytes = 64;
  format.src_index = 1;
  format.heads = 2;
  const ep::RowAreas areas = ep::RowAreas::of(1, format);
  const std::array<int32_t, 2> host_heads = {5, -1};
  const int32_t host_src = 9;
  auto run = [&](bool heads_on_device, bool src_on_device) {
    SimulatedDevice dev;
    auto x = dev.allocate(64), tokens = dev.allocate(4), heads = dev.allocate(8),
         src = dev.allocate(4), sink_area = dev.allocate(areas.end);
    const int32_t token = 0;
    dev.copy(tokens.get(), &token, 4);
    dev.copy(heads.get(), host_heads.data(), 8);
    dev.copy(src.get(), &host_src, 4);
    ep::ChunkParams chunk;
    chunk.input.x = x.get();
    chunk.input.format = format;
    chunk.input.shape = ep::EpShape{4, 2, 4};
    chunk.input.heads =
        heads_on_device ? reinterpret_cast<const int32_t*>(heads.get()) : host_heads.data();
    chunk.input.head_stride = 2;
    chunk.input.src_index = src_on_device ? reinterpret_cast<const int32_t*>(src.get()) : &host_src;
    chunk.tokens = reinterpret_cast<const int32_t*>(tokens.get());
    chunk.rows = 1;
    chunk.sink = ep::RowSink::at(sink_area.get(), areas, 0, -1);
    queue_kernel(dev, &EpKernels::dispatch_chunk, chunk);
    std::array<int32_t, 3> back{};
    dev.copy(back.data(), sink_area.get() + areas.heads, 8);
    dev.copy(back.data() + 2, sink_area.get() + areas.src_index, 4);
    const std::string error = error_of([&] { dev.synchronize("forward", 10s); });
    if (error.empty()) CHECK(back == std::array<int32_t, 3>{5, -1, 9});
    return error;
  };
  CHECK(run(true, true).empty());
  CHECK(run(false, true).find("dispatch_chunk: heads") != std::string::npos);
  CHECK(run(true, false).find("dispatch_chunk: src_index") != std::string::npos);
}

TEST_CASE("simulated device: a low-latency row table entry in plain host memory fails the stream") {
  SimulatedDevice dev;
  const uint32_t hidden = 128;
  auto rows = dev.allocate(2 * sizeof(void*));
  auto weights = dev.allocate(2 * 4);
  auto out = dev.allocate(2ull * hidden);
  auto reachable_row = dev.allocate(2ull * hidden);
  std::vector<uint16_t> plain(hidden);  // a slot the caller forgot to register
  const std::array<const uint16_t*, 2> table = {
      reinterpret_cast<const uint16_t*>(reachable_row.get()), plain.data()};
  dev.copy(rows.get(), table.data(), sizeof(table));
  queue_kernel(dev, &EpKernels::ll_combine,
               {.rows = reinterpret_cast<const uint16_t* const*>(rows.get()),
                .weights = reinterpret_cast<const float*>(weights.get()),
                .out = reinterpret_cast<uint16_t*>(out.get()),
                .num_tokens = 1,
                .topk = 2,
                .hidden = hidden});
  CHECK(error_of([&] {
          dev.synchronize("low_latency_combine", 10s);
        }).find("low_latency_combine: the simulated device failed: ll_combine: row at") !=
        std::string::npos);
}

// What the CUDA kernels' 16-byte loads and stores need: a misaligned row is
// cudaErrorMisalignedAddress there (the context is gone), refused here.
TEST_CASE("simulated device: a row the kernels would read unaligned is refused, naming it") {
  SimulatedDevice dev;
  const uint32_t hidden = 128;
  auto rows = dev.allocate(sizeof(void*));
  auto weights = dev.allocate(4);
  auto out = dev.allocate(2ull * hidden + 16);
  auto row = dev.allocate(2ull * hidden + 16);
  const std::array<const uint16_t*, 1> table = {
      reinterpret_cast<const uint16_t*>(row.get() + 8)};  // inside device memory, 8 bytes off
  dev.copy(rows.get(), table.data(), sizeof(table));
  ep::LlCombineParams params{.rows = reinterpret_cast<const uint16_t* const*>(rows.get()),
                             .weights = reinterpret_cast<const float*>(weights.get()),
                             .out = reinterpret_cast<uint16_t*>(out.get() + 2),
                             .num_tokens = 1,
                             .topk = 1,
                             .hidden = hidden};
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::ll_combine, params);
        }).find("ll_combine: out at") != std::string::npos);
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::ll_combine, params);
        }).find("is not 16-byte aligned") != std::string::npos);
  params.out = reinterpret_cast<uint16_t*>(out.get());
  queue_kernel(dev, &EpKernels::ll_combine, params);
  CHECK(error_of([&] { dev.synchronize("low_latency_combine", 10s); }).find("ll_combine: row at") !=
        std::string::npos);
}

// V2's combine tables (row_rules.hpp CombineInput::order, weight_owner) are read by the kernel
// like send_head: host memory is refused when queued, and a group out of range (which a GPU
// would take as an index into the per-rank tables) fails the stream.
TEST_CASE("simulated device: V2's order tables must be device memory, their groups in range") {
  SimulatedDevice dev;
  constexpr int64_t kHidden = ep::kCombineChunk;
  auto block = dev.allocate(2 * 2 * kHidden);  // rank r's one row at r * kHidden
  auto table = dev.allocate(2 * sizeof(void*));
  auto weights = dev.allocate(2 * 4);
  auto weight_table = dev.allocate(2 * sizeof(void*));
  auto head = dev.allocate(2 * 4);
  auto order = dev.allocate(2 * 4);
  auto owner = dev.allocate(4);
  auto out = dev.allocate(2 * kHidden);
  auto out_weights = dev.allocate(4);
  std::vector<uint16_t> values(2 * kHidden);
  for (int64_t j = 0; j < kHidden; ++j) {
    values[j] = ep::float_to_bf16(1.0f);
    values[kHidden + j] = ep::float_to_bf16(2.0f);
  }
  dev.copy(block.get(), values.data(), values.size() * 2);
  const auto* rows = reinterpret_cast<const uint16_t*>(block.get());
  const std::array<const uint16_t*, 2> row_ptrs = {rows, rows + kHidden};
  dev.copy(table.get(), row_ptrs.data(), sizeof row_ptrs);
  const auto* w = reinterpret_cast<const float*>(weights.get());
  const std::array<const float*, 2> weight_ptrs = {w, w + 1};
  dev.copy(weight_table.get(), weight_ptrs.data(), sizeof weight_ptrs);
  const std::array<float, 2> weight_values = {0.25f, 0.5f};
  dev.copy(weights.get(), weight_values.data(), sizeof weight_values);
  const std::array<int32_t, 2> heads = {0, 0}, groups = {1, 0};
  const std::array<int32_t, 1> owners = {1};
  dev.copy(head.get(), heads.data(), sizeof heads);
  dev.copy(order.get(), groups.data(), sizeof groups);
  dev.copy(owner.get(), owners.data(), sizeof owners);
  ep::CombineParams p;
  p.input =
      ep::CombineInput{.block_rows = reinterpret_cast<const uint16_t* const*>(table.get()),
                       .block_weights = reinterpret_cast<const float* const*>(weight_table.get()),
                       .send_head = reinterpret_cast<const int32_t*>(head.get()),
                       .order = reinterpret_cast<const int32_t*>(order.get()),
                       .weight_owner = reinterpret_cast<const int32_t*>(owner.get()),
                       .out = reinterpret_cast<uint16_t*>(out.get()),
                       .out_weights = reinterpret_cast<float*>(out_weights.get()),
                       .num_ranks = 2,
                       .hidden = kHidden,
                       .topk = 1};
  p.num_tokens = 1;

  // Reachable: the reduce runs, the weight is rank 1's, selected.
  queue_kernel(dev, &EpKernels::combine, p);
  std::array<uint16_t, kHidden> got{};
  float got_weight = 0;
  dev.copy(got.data(), out.get(), sizeof got);
  dev.copy(&got_weight, out_weights.get(), 4);
  dev.synchronize("combine", 10s);
  CHECK(ep::bf16_to_float(got[0]) == 3.0f);
  CHECK(got_weight == 0.5f);

  ep::CombineParams plain = p;
  plain.input.order = groups.data();
  CHECK(error_of([&] { queue_kernel(dev, &EpKernels::combine, plain); }).find("combine: order") !=
        std::string::npos);
  plain = p;
  plain.input.weight_owner = owners.data();
  CHECK(error_of([&] {
          queue_kernel(dev, &EpKernels::combine, plain);
        }).find("combine: weight_owner") != std::string::npos);

  const std::array<int32_t, 2> bad = {5, -1};
  dev.copy(order.get(), bad.data(), sizeof bad);
  queue_kernel(dev, &EpKernels::combine, p);
  CHECK(error_of([&] { dev.synchronize("combine", 10s); }).find("combine: order[0][0] = 5") !=
        std::string::npos);
}
