// The host-simulated device (gpu_side/device/simulated_device.hpp): the addresses it refuses.
// A kernel handed memory a GPU could not reach (plain host memory, past an allocation, freed,
// unaligned), directly or inside a table the kernel reads, fails naming what it read, the way a
// GPU build would fault or read garbage.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
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
