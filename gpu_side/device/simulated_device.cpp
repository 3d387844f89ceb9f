// The host-simulated device (simulated_device.hpp): construction, memory, kernels, rings. Events,
// signal words and synchronize: simulated_device_sync.cpp.
#include "gpu_side/device/simulated_device.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu_side/device/simulated_device_core.hpp"
#include "gpu_side/device/simulated_shared_handle.hpp"
#include "gpu_side/device/thread_access_key.hpp"
#include "gpu_side/ep/layout_rules.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::gpu_side::device {

namespace {

constexpr std::string_view kPhase = kSimulatedPhase;

uint64_t page_rounded(uint64_t bytes) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
}

// What a kernel's loads and stores need of an address (16: the int4 copies of rows; 8 and 4:
// the int64 and float fields): on a GPU a misaligned one is cudaErrorMisalignedAddress, which
// ends the context, so the simulated device refuses it.
void require_aligned(std::string_view op, std::string_view what, const void* at,
                     uintptr_t alignment) {
  require(reinterpret_cast<uintptr_t>(at) % alignment == 0, kPhase,
          "{}: {} at {} is not {}-byte aligned", op, what, at, alignment);
}

}  // namespace

SimulatedDevice::SimulatedDevice(SimulatedDeviceOptions options)
    : SimulatedDevice(std::make_shared<Memory>(), options) {
  if (options.protect_device_memory) {
    core_->memory->key = ThreadAccessKey::allocate();
    core_->memory->gated = !core_->memory->key && options.gate_without_keys;
    if (core_->memory->gated)
      log::debug(
          "simulated device: no memory protection keys here; device memory is closed to the "
          "host while the device runs nothing (mprotect), open to every thread while it runs");
  }
  core_->worker = std::thread([core = core_.get()] { core->run(); });
}

SimulatedDevice::SimulatedDevice(std::shared_ptr<Memory> memory, SimulatedDeviceOptions options)
    : core_(std::make_shared<Core>()) {
  core_->options = options;
  core_->memory = std::move(memory);
}

std::shared_ptr<SimulatedDevice> SimulatedDevice::another_stream(
    SimulatedDeviceOptions options) const {
  // Not make_shared: the constructor that shares the memory is private.
  std::shared_ptr<SimulatedDevice> stream(new SimulatedDevice(core_->memory, options));
  stream->core_->worker = std::thread([core = stream->core_.get()] { core->run(); });
  return stream;
}

SimulatedDevice::~SimulatedDevice() {
  {
    std::lock_guard lock(core_->mutex);
    core_->stopping = true;
    core_->run_before = UINT64_MAX;  // what is still queued runs before the worker stops
  }
  core_->wake.notify_all();
  core_->worker.join();
  std::vector<std::function<void()>> releases;  // of a capture never ended: nothing launches it
  std::vector<Core::Capture::Joined> joined;
  {
    std::lock_guard lock(core_->mutex);
    core_->stopped = true;
    if (core_->capture && core_->capture->origin == core_.get()) {
      std::lock_guard recording(core_->capture->mutex);
      releases = std::move(core_->capture->releases);
      joined = std::move(core_->capture->joined);
    }
    core_->capture.reset();
  }
  // The streams that joined a capture no graph will come of record into it no more.
  for (const Core::Capture::Joined& j : joined) {
    std::lock_guard lock(j.stream->mutex);
    j.stream->capture.reset();
  }
  for (auto& release : releases)
    release();
}

bool SimulatedDevice::device_memory_protected() const {
  return core_->memory->key.has_value() || core_->memory->gated;
}

uint64_t SimulatedDevice::device_bytes_in_use() const {
  std::lock_guard lock(core_->memory->mutex);
  return core_->memory->device_bytes;
}

uint64_t SimulatedDevice::operations_run() const {
  std::lock_guard lock(core_->mutex);
  return core_->ops_run;
}

std::shared_ptr<std::byte[]> SimulatedDevice::allocate(uint64_t bytes) {
  return allocate_mapped(bytes, true);
}

NicMemory SimulatedDevice::allocate_for_nic(uint64_t bytes) {
  if (!core_->options.nic_reads_device_memory) return {};
  return {.memory = allocate_mapped(bytes, false), .bytes = bytes, .registers_as_host = true};
}

std::shared_ptr<std::byte[]> SimulatedDevice::allocate_mapped(uint64_t bytes, bool tagged) {
  const uint64_t mapped = page_rounded(bytes);
  void* memory =
      ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  require(memory != MAP_FAILED, kPhase, "allocate: {} bytes of device memory: {}", bytes,
          std::strerror(errno));
  Memory& shared = *core_->memory;
  if (tagged && shared.key && !shared.key->tag(memory, mapped)) {
    ::munmap(memory, mapped);
    fail(std::string(kPhase), "allocate: tagging {} bytes with the protection key failed: {}",
         mapped, std::strerror(errno));
  }
  try {
    std::lock_guard lock(shared.mutex);
    shared.add_device_range(memory, mapped, tagged);
  } catch (...) {
    ::munmap(memory, mapped);
    throw;
  }
  return std::shared_ptr<std::byte[]>(
      static_cast<std::byte*>(memory),
      [core = core_, mapped](std::byte* p) { core->release(p, mapped); });
}

SharedMemory SimulatedDevice::allocate_shared(uint64_t bytes) {
  if (!core_->options.shares_memory) return {};
  HostMemory file = HostMemory::memfd(page_rounded(bytes), "proxyep-simulated-device");
  const bool nic = core_->options.nic_reads_device_memory;
  SharedMemory shared;
  shared.handle = encode_shared_handle({.nic_reads = nic,
                                        .pid = static_cast<uint64_t>(::getpid()),
                                        .fd = static_cast<uint64_t>(file.fd()),
                                        .bytes = bytes});
  shared.bytes = bytes;
  shared.fd = file.fd();  // owned by the mapping's owner, which `memory` keeps alive
  shared.memory = adopt_shared(std::move(file), !nic, kPhase);
  shared.nic_reads = shared.registers_as_host = nic;
  return shared;
}

std::shared_ptr<std::byte[]> SimulatedDevice::open_shared(std::span<const uint8_t> handle,
                                                          uint64_t bytes, std::string_view phase) {
  const SimulatedSharedHandle h = read_shared_handle(handle, bytes, "open_shared", phase);
  return adopt_shared(HostMemory::map_process_fd(h.pid, h.fd), true, phase);
}

std::shared_ptr<std::byte[]> SimulatedDevice::adopt_shared(HostMemory file, bool tagged,
                                                           std::string_view phase) {
  Memory& shared = *core_->memory;
  const uint64_t mapped = file.size();
  auto* memory = static_cast<std::byte*>(file.host());
  require(!tagged || !shared.key || shared.key->tag(memory, mapped), phase,
          "tagging {} bytes of shared device memory with the protection key failed: {}", mapped,
          std::strerror(errno));
  {
    std::lock_guard lock(shared.mutex);
    shared.add_device_range(memory, mapped, tagged);  // on failure `file` unmaps it
  }
  auto owner = std::make_shared<HostMemory>(std::move(file));
  return std::shared_ptr<std::byte[]>(memory, [core = core_, mapped, owner](std::byte* p) mutable {
    core->release(p, mapped, [owner = std::move(owner)]() mutable { owner.reset(); });
  });
}

void* SimulatedDevice::register_host(void* host, uint64_t bytes) {
  require(host != nullptr && bytes > 0, kPhase, "register_host: no memory given");
  Memory& shared = *core_->memory;
  std::lock_guard lock(shared.mutex);
  const auto start = reinterpret_cast<uintptr_t>(host);
  auto next = shared.ranges.lower_bound(start);
  const bool overlaps_next = next != shared.ranges.end() && next->first < start + bytes;
  const bool overlaps_previous = next != shared.ranges.begin() &&
                                 std::prev(next)->first + std::prev(next)->second.bytes > start;
  require(!overlaps_next && !overlaps_previous, kPhase,
          "register_host: {} ({} bytes) overlaps memory the device already reaches", host, bytes);
  shared.ranges[start] = {bytes, false};
  return host;
}

void SimulatedDevice::unregister_host(void* host) {
  Memory& shared = *core_->memory;
  std::lock_guard lock(shared.mutex);
  auto it = shared.ranges.find(reinterpret_cast<uintptr_t>(host));
  require(it != shared.ranges.end() && !it->second.device, kPhase,
          "unregister_host: {} was not registered", host);
  shared.ranges.erase(it);
}

void SimulatedDevice::copy(void* to, const void* from, uint64_t bytes) {
  if (bytes == 0) return;
  require(to != nullptr && from != nullptr, kPhase, "copy: null address");
  // Plain host memory is allowed on either side (a staged copy); device memory must be whole.
  auto check_side = [&](const void* p, std::string_view what) {
    const bool reached = core_->reachable(p, 1);
    if (reached) core_->require_reachable("copy", what, p, bytes);
  };
  check_side(to, "destination");
  check_side(from, "source");
  const uint64_t limit = core_->options.max_read_back_bytes;
  require(limit == 0 || bytes <= limit || core_->reachable(to, 1) || !core_->reachable(from, 1),
          kPhase,
          "copy: {} bytes from device memory into plain host memory, more than the {} a "
          "read-back may move here (max_read_back_bytes)",
          bytes, limit);
  if (!core_->reachable(to, 1) || !core_->reachable(from, 1)) {
    std::lock_guard lock(core_->mutex);
    core_->refuse_in_capture(fmt::format("copy: {} bytes {} plain host memory", bytes,
                                         core_->reachable(to, 1) ? "from" : "into"),
                             kPhase);
  }
  core_->enqueue("copy", [to, from, bytes] { std::memmove(to, from, bytes); });
}

void SimulatedDevice::fill(void* to, uint8_t value, uint64_t bytes) {
  if (bytes == 0) return;
  core_->require_reachable("fill", "destination", to, bytes);
  core_->enqueue("fill", [to, value, bytes] { std::memset(to, value, bytes); });
}

void SimulatedDevice::dispatch_layout(const ep::LayoutParams& p) {
  const ep::EpShape& s = p.shape;
  require(s.num_ranks >= 1 && s.ranks_per_node >= 1 && s.num_experts >= 1 &&
              s.num_experts % s.num_ranks == 0 && p.num_tokens >= 0 && p.topk >= 0 &&
              p.topk <= ep::kMaxTopk,
          kPhase, "dispatch_layout: inconsistent parameters");
  const Core& c = *core_;
  const auto tokens = static_cast<uint64_t>(p.num_tokens);
  c.require_reachable("dispatch_layout", "topk_idx", p.topk_idx, tokens * p.topk * 8);
  c.require_reachable("dispatch_layout", "tokens_per_rank", p.tokens_per_rank, 4ull * s.num_ranks);
  if (p.tokens_per_node != nullptr)
    c.require_reachable("dispatch_layout", "tokens_per_node", p.tokens_per_node,
                        4ull * s.num_nodes());
  c.require_reachable("dispatch_layout", "tokens_per_expert", p.tokens_per_expert,
                      4ull * s.num_experts);
  c.require_reachable("dispatch_layout", "is_token_in_rank", p.is_token_in_rank,
                      tokens * s.num_ranks);
  require(p.tokens_per_rank != nullptr && p.tokens_per_expert != nullptr, kPhase,
          "dispatch_layout: no counters");
  core_->enqueue("dispatch_layout", [p] {
    const ep::EpShape& s = p.shape;
    std::memset(p.tokens_per_rank, 0, 4ull * s.num_ranks);
    if (p.tokens_per_node != nullptr) std::memset(p.tokens_per_node, 0, 4ull * s.num_nodes());
    std::memset(p.tokens_per_expert, 0, 4ull * s.num_experts);
    for (int64_t t = 0; t < p.num_tokens; ++t)
      ep::count_token(p.topk_idx + t * p.topk, p.topk, s, p.tokens_per_rank, p.tokens_per_node,
                      p.tokens_per_expert, p.is_token_in_rank + t * s.num_ranks);
  });
}

namespace {

// Every byte dispatch_row reads and writes for token t -> row `row` of `sink`, checked before
// the row is written (on the stream, where the tables holding these addresses can be read).
void check_row(const SimulatedDevice::Core& c, std::string_view op, const ep::RowInput& in,
               const ep::RowSink& sink, int64_t row, int64_t t) {
  const ep::RowFormat& f = in.format;
  const int64_t r = sink.first_row + row;
  require(t >= 0 && r >= 0, kPhase, "{}: token {} to row {}", op, t, r);
  c.require_reachable(op, "x row", in.x + t * f.hidden_bytes, f.hidden_bytes);
  c.require_reachable(op, "sink x row", sink.x + r * f.hidden_bytes, f.hidden_bytes);
  if (f.scale_cols > 0) {
    const int64_t last = t * in.scale_row_stride + (f.scale_cols - 1) * in.scale_col_stride;
    c.require_reachable(op, "x_scales", in.scales + t * in.scale_row_stride, 4);
    c.require_reachable(op, "x_scales", in.scales + last, 4);
    c.require_reachable(op, "sink scales row", sink.scales + r * f.scale_cols, 4ull * f.scale_cols);
  }
  if (f.scale_cols > 0) require_aligned(op, "sink scales row", sink.scales + r * f.scale_cols, 4);
  if (f.topk > 0) {
    c.require_reachable(op, "topk_idx row", in.topk_idx + t * f.topk, 8ull * f.topk);
    c.require_reachable(op, "sink topk_idx row", sink.topk_idx + r * f.topk, 8ull * f.topk);
    require_aligned(op, "sink topk_idx row", sink.topk_idx + r * f.topk, 8);
  }
  if (f.weights > 0) {
    c.require_reachable(op, "topk_weights row", in.topk_weights + t * f.topk, 4ull * f.topk);
    c.require_reachable(op, "sink weights row", sink.weights + r * f.topk, 4ull * f.topk);
    require_aligned(op, "sink weights row", sink.weights + r * f.topk, 4);
  }
  if (f.src_index > 0) {
    c.require_reachable(op, "sink src_index", sink.src_index + r, 4);
    require_aligned(op, "sink src_index", sink.src_index + r, 4);
  }
  // A forwarder's inputs (hierarchical internode): the source indices it passes on and the heads.
  if (in.src_index != nullptr) c.require_reachable(op, "src_index", in.src_index + t, 4);
  if (f.heads > 0) {
    c.require_reachable(op, "heads", in.heads + t * in.head_stride + in.head_first, 4ull * f.heads);
    c.require_reachable(op, "sink heads row", sink.heads + r * f.heads, 4ull * f.heads);
  }
}

}  // namespace

void SimulatedDevice::dispatch_rows(const ep::DispatchParams& p) {
  const int ranks = p.input.shape.num_ranks;
  require(ranks >= 1 && p.num_tokens >= 0 && p.threads > 0 && p.threads % 32 == 0, kPhase,
          "dispatch_rows: inconsistent parameters");
  const auto tokens = static_cast<uint64_t>(p.num_tokens);
  core_->require_reachable("dispatch_rows", "send_head", p.send_head, tokens * ranks * 4);
  core_->require_reachable("dispatch_rows", "sinks", p.sinks, sizeof(ep::RowSink) * ranks);
  core_->enqueue("dispatch_rows", [p, core = core_.get()] {
    const int ranks = p.input.shape.num_ranks;
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int d = 0; d < ranks; ++d) {
        const int32_t row = p.send_head[t * ranks + d];
        const ep::RowSink& sink = p.sinks[d];
        if (row < 0 || sink.x == nullptr) continue;
        check_row(*core, "dispatch_rows", p.input, sink, row, t);
        ep::dispatch_row(p.input, sink, row, t, ep::HostLanes{});
      }
  });
}

void SimulatedDevice::dispatch_chunk(const ep::ChunkParams& p) {
  require(p.rows >= 0 && p.threads > 0 && p.threads % 32 == 0, kPhase,
          "dispatch_chunk: inconsistent parameters");
  if (p.rows == 0) return;
  core_->require_reachable("dispatch_chunk", "tokens", p.tokens, static_cast<uint64_t>(p.rows) * 4);
  core_->enqueue("dispatch_chunk", [p, core = core_.get()] {
    for (int64_t i = 0; i < p.rows; ++i) {
      check_row(*core, "dispatch_chunk", p.input, p.sink, i, p.tokens[i]);
      ep::dispatch_row(p.input, p.sink, i, p.tokens[i], ep::HostLanes{});
    }
  });
}

void SimulatedDevice::combine(const ep::CombineParams& p) {
  const ep::CombineInput& in = p.input;
  require(in.num_ranks >= 1 && in.hidden > 0 && in.hidden % ep::kCombineChunk == 0 &&
              in.topk >= 0 && p.num_tokens >= 0 && p.threads > 0 && p.threads % 32 == 0,
          kPhase, "combine: inconsistent parameters");
  const auto tokens = static_cast<uint64_t>(p.num_tokens);
  const auto ranks = static_cast<uint64_t>(in.num_ranks);
  const uint64_t row_bytes = static_cast<uint64_t>(in.hidden) * 2;
  const Core& c = *core_;
  c.require_reachable("combine", "send_head", in.send_head, tokens * ranks * 4);
  c.require_reachable("combine", "out", in.out, tokens * row_bytes);
  require_aligned("combine", "out", in.out, 16);
  for (const auto& [bias, name] : {std::pair{in.bias0, "bias0"}, std::pair{in.bias1, "bias1"}}) {
    if (bias == nullptr) continue;
    c.require_reachable("combine", name, bias, tokens * row_bytes);
    require_aligned("combine", name, bias, 16);
  }
  c.require_reachable("combine", "block_rows", in.block_rows, ranks * sizeof(void*));
  if (in.topk > 0) {
    c.require_reachable("combine", "out_weights", in.out_weights, tokens * in.topk * 4);
    c.require_reachable("combine", "block_weights", in.block_weights, ranks * sizeof(void*));
  }
  if (in.block_chunk_rows != nullptr) {
    c.require_reachable("combine", "block_chunk_rows", in.block_chunk_rows, ranks * 8);
    c.require_reachable("combine", "block_chunks", in.block_chunks, ranks * sizeof(void*));
  }
  core_->enqueue("combine", [p, core = core_.get(), row_bytes] {
    const ep::CombineInput& in = p.input;
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      for (int r = 0; r < in.num_ranks; ++r) {
        const int32_t pos = in.send_head[t * in.num_ranks + r];
        if (pos < 0) continue;
        if (in.block_chunk_rows != nullptr && in.block_chunk_rows[r] > 0)
          core->require_reachable("combine", "chunk table entry",
                                  in.block_chunks[r] + pos / in.block_chunk_rows[r], sizeof(void*));
        core->require_reachable("combine", "returned row", ep::block_row(in, r, pos), row_bytes);
        require_aligned("combine", "returned row", ep::block_row(in, r, pos), 16);
        if (in.topk > 0)
          core->require_reachable("combine", "returned weights",
                                  in.block_weights[r] + int64_t{pos} * in.topk, 4ull * in.topk);
      }
      ep::combine_token(in, t, ep::HostLanes{});
    }
  });
}

void SimulatedDevice::add(const ep::AddParams& p) {
  require(p.count >= 0, kPhase, "add: inconsistent parameters");
  if (p.count == 0) return;
  const uint64_t bytes = static_cast<uint64_t>(p.count) * (p.wide ? 8 : 4);
  core_->require_reachable("add", "to", p.to, bytes);
  core_->require_reachable("add", "from", p.from, bytes);
  core_->enqueue("add", [p] {
    for (int64_t i = 0; i < p.count; ++i)
      if (p.wide)
        static_cast<int64_t*>(p.to)[i] += static_cast<const int64_t*>(p.from)[i];
      else
        static_cast<int32_t*>(p.to)[i] += static_cast<const int32_t*>(p.from)[i];
  });
}

void SimulatedDevice::copy_runs(const ep::CopyRunsParams& p) {
  require(p.num_runs >= 0, kPhase, "copy_runs: inconsistent parameters");
  if (p.num_runs == 0) return;
  core_->require_reachable("copy_runs", "runs", p.runs,
                           static_cast<uint64_t>(p.num_runs) * sizeof(ep::CopyRun));
  core_->enqueue("copy_runs", [p, core = core_.get()] {
    for (int64_t r = 0; r < p.num_runs; ++r) {
      const ep::CopyRun& run = p.runs[r];
      if (run.bytes == 0) continue;
      // A kernel reaches only device memory and registered host memory (copy() also takes
      // plain host memory: the DMA engine's).
      core->require_reachable("copy_runs", "a run's destination", run.to, run.bytes);
      core->require_reachable("copy_runs", "a run's source", run.from, run.bytes);
      std::memcpy(run.to, run.from, run.bytes);
    }
  });
}

void SimulatedDevice::ll_pack(const ep::LlPackParams& p) {
  require(ep::ll_format_error(p.format) == nullptr && p.num_items >= 0 && p.threads > 0 &&
              p.threads % 32 == 0,
          kPhase, "ll_pack: inconsistent parameters");
  if (p.num_items == 0) return;
  core_->require_reachable("ll_pack", "items", p.items,
                           static_cast<uint64_t>(p.num_items) * sizeof(ep::LlPackItem));
  core_->enqueue("ll_pack", [p, core = core_.get()] {
    const uint64_t row_bytes = 2ull * p.format.hidden, message = p.format.message_bytes();
    for (int64_t i = 0; i < p.num_items; ++i) {
      const ep::LlPackItem item = p.items[i];
      require(item.token >= 0 && reinterpret_cast<uintptr_t>(item.message) % 16 == 0, kPhase,
              "ll_pack: item {} packs token {} at {}", i, item.token,
              static_cast<const void*>(item.message));
      const uint16_t* x = p.x + static_cast<int64_t>(item.token) * p.format.hidden;
      core->require_reachable("ll_pack", "x row", x, row_bytes);
      core->require_reachable("ll_pack", "message", item.message, message);
      ep::ll_pack_message(p.format, x, item.token, item.message, ep::HostLanes{});
    }
  });
}

void SimulatedDevice::ll_route(const ep::LlRouteParams& p) {
  const char* error = ep::ll_route_error(p);
  require(error == nullptr, kPhase, "ll_route: {}", error != nullptr ? error : "");
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const Core& c = *core_;
  c.require_reachable("ll_route", "topk_idx", p.topk_idx, 8 * selections);
  c.require_reachable("ll_route", "positions", p.positions, 4 * selections);
  c.require_reachable("ll_route", "counts", p.counts, 4ull * static_cast<uint64_t>(p.num_experts));
  c.require_reachable("ll_route", "invalid", p.invalid, 4);
  core_->enqueue("ll_route", [p] { ep::ll_route_on_host(p); });
}

namespace {

// The tables a routed kernel (pack or combine) reads besides its own: ll_route's output and
// `table`, one address per rank.
void require_routing_reachable(const SimulatedDevice::Core& c, std::string_view op,
                               const int64_t* topk_idx, const int32_t* positions,
                               const int32_t* counts, const void* table, uint64_t selections,
                               int32_t experts, int32_t local_experts) {
  c.require_reachable(op, "topk_idx", topk_idx, 8 * selections);
  c.require_reachable(op, "positions", positions, 4 * selections);
  c.require_reachable(op, "counts", counts, 4ull * static_cast<uint64_t>(experts));
  c.require_reachable(op, "rank table", table,
                      sizeof(void*) * static_cast<uint64_t>(experts / local_experts));
}

// On the stream, where the tables can be read, as the kernel reads them: every placed selection
// names an expert, and the `bytes` at `place(i)` (null: skipped) are 16-byte aligned and
// reachable, before anything is written.
template <typename Place>
void require_routed_places(const SimulatedDevice::Core& c, std::string_view op,
                           std::string_view what, const int64_t* topk_idx, const int32_t* positions,
                           uint64_t selections, int32_t experts, uint64_t bytes,
                           const Place& place) {
  for (uint64_t i = 0; i < selections; ++i) {
    if (positions[i] < 0) continue;
    const int64_t e = topk_idx[i];
    require(e >= 0 && e < experts, kPhase, "{}: selection {} has position {} but names expert {}",
            op, i, positions[i], e);
    const void* at = place(static_cast<int64_t>(i));
    if (at == nullptr) continue;
    require_aligned(op, fmt::format("{} of selection {}", what, i), at, 16);
    c.require_reachable(op, what, at, bytes);
  }
}

}  // namespace

void SimulatedDevice::ll_pack_routed(const ep::LlPackRoutedParams& p) {
  const char* error = ep::ll_pack_routed_error(p);
  require(error == nullptr, kPhase, "ll_pack_routed: {}", error != nullptr ? error : "");
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  if (selections == 0) return;
  core_->require_reachable("ll_pack_routed", "x", p.x,
                           2ull * p.format.hidden * static_cast<uint64_t>(p.num_tokens));
  require_routing_reachable(*core_, "ll_pack_routed", p.topk_idx, p.positions, p.counts, p.slots,
                            selections, p.num_experts, p.local_experts);
  core_->enqueue("ll_pack_routed", [p, core = core_.get(), selections] {
    require_routed_places(*core, "ll_pack_routed", "message", p.topk_idx, p.positions, selections,
                          p.num_experts, p.format.message_bytes(),
                          [&p](int64_t i) { return ep::ll_routed_destination(p, i); });
    ep::ll_pack_routed_on_host(p);
  });
}

void SimulatedDevice::ll_combine_routed(const ep::LlCombineRoutedParams& p) {
  const char* error = ep::ll_combine_routed_error(p);
  require(error == nullptr, kPhase, "ll_combine_routed: {}", error != nullptr ? error : "");
  if (p.num_tokens == 0) return;
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const uint64_t row_bytes = 2ull * p.hidden;
  require_routing_reachable(*core_, "ll_combine_routed", p.topk_idx, p.positions, p.counts, p.from,
                            selections, p.num_experts, p.local_experts);
  core_->require_reachable("ll_combine_routed", "weights", p.weights, selections * 4);
  core_->require_reachable("ll_combine_routed", "out", p.out,
                           static_cast<uint64_t>(p.num_tokens) * row_bytes);
  core_->enqueue("ll_combine_routed", [p, core = core_.get(), selections, row_bytes] {
    require_routed_places(*core, "ll_combine_routed", "row", p.topk_idx, p.positions, selections,
                          p.num_experts, row_bytes,
                          [&p](int64_t i) { return ep::ll_routed_row(p, i); });
    ep::ll_combine_routed_on_host(p);
  });
}

void SimulatedDevice::count_mismatches(const ep::MismatchParams& p) {
  const char* error = ep::mismatch_error(p);
  require(error == nullptr, kPhase, "count_mismatches: {}", error != nullptr ? error : "");
  const auto bytes = 8 * static_cast<uint64_t>(p.count);
  const Core& c = *core_;
  c.require_reachable("count_mismatches", "a", p.a, bytes);
  c.require_reachable("count_mismatches", "b", p.b, bytes);
  c.require_reachable("count_mismatches", "mismatches", p.mismatches, 4);
  core_->enqueue("count_mismatches", [p] { ep::count_mismatches_on_host(p); });
}

void SimulatedDevice::ll_unpack_counted(const ep::LlUnpackCountedParams& p) {
  const char* error = ep::ll_unpack_counted_error(p);
  require(error == nullptr, kPhase, "ll_unpack_counted: {}", error != nullptr ? error : "");
  const auto R = static_cast<uint64_t>(p.ranks), L = static_cast<uint64_t>(p.local_experts);
  const Core& c = *core_;
  c.require_reachable("ll_unpack_counted", "counts", p.counts, 4 * R * L);
  c.require_reachable("ll_unpack_counted", "from", p.from, sizeof(void*) * R);
  c.require_reachable("ll_unpack_counted", "sinks", p.sinks, sizeof(ep::LlExpertSink) * L);
  c.require_reachable("ll_unpack_counted", "recv_count", p.recv_count, 4 * L);
  c.require_reachable("ll_unpack_counted", "layout_range", p.layout_range, 8 * R * L);
  core_->enqueue("ll_unpack_counted", [p, core = core_.get()] {
    // What the kernel tolerates (ll_counted.hpp) is a caller's mistake here: counts no sink
    // holds, a source with messages and no slot, and every place a pair reads or writes.
    const ep::LlFormat& f = p.format;
    for (int32_t e = 0; e < p.local_experts; ++e) {
      int64_t rows = 0;
      for (int32_t s = 0; s < p.ranks; ++s) {
        const int32_t count = p.counts[static_cast<int64_t>(s) * p.local_experts + e];
        require(count >= 0, kPhase,
                "ll_unpack_counted: source {} announced {} messages for "
                "expert {}",
                s, count, e);
        rows += count;
        const ep::LlCountedPlace place = ep::ll_counted_place(p, e, s);
        if (place.count == 0) continue;
        require(p.from[s] != nullptr, kPhase,
                "ll_unpack_counted: source {} announced messages but has no slot", s);
        const auto n = static_cast<uint64_t>(place.count);
        const auto first = static_cast<uint64_t>(place.first_row);
        core->require_reachable(
            "ll_unpack_counted", "source messages",
            p.from[s] + static_cast<uint64_t>(place.first_message) * f.message_bytes(),
            n * f.message_bytes());
        const ep::LlExpertSink& sink = p.sinks[e];
        core->require_reachable("ll_unpack_counted", "sink x rows",
                                sink.x + first * f.payload_bytes(), n * f.payload_bytes());
        core->require_reachable("ll_unpack_counted", "sink src_info", sink.src_info + first, 4 * n);
        if (f.scale_words() > 0) {
          core->require_reachable("ll_unpack_counted", "sink scales", sink.scales + first, 4 * n);
          core->require_reachable(
              "ll_unpack_counted", "sink scales",
              sink.scales + static_cast<int64_t>(f.scale_words() - 1) * sink.scale_stride + first,
              4 * n);
        }
      }
      require(rows <= p.rows_per_expert, kPhase,
              "ll_unpack_counted: expert {} was announced {} messages, its sink holds {}", e, rows,
              p.rows_per_expert);
    }
    ep::ll_unpack_counted_on_host(p);
  });
}

void SimulatedDevice::ll_return_counted(const ep::LlReturnCountedParams& p) {
  const char* error = ep::ll_return_counted_error(p);
  require(error == nullptr, kPhase, "ll_return_counted: {}", error != nullptr ? error : "");
  const auto R = static_cast<uint64_t>(p.ranks), L = static_cast<uint64_t>(p.local_experts);
  const Core& c = *core_;
  c.require_reachable("ll_return_counted", "layout_range", p.layout_range, 8 * R * L);
  c.require_reachable("ll_return_counted", "to", p.to, sizeof(void*) * R);
  c.require_reachable("ll_return_counted", "x", p.x,
                      2ull * p.hidden * L * static_cast<uint64_t>(p.rows_per_expert));
  core_->enqueue("ll_return_counted", [p, core = core_.get()] {
    // What the kernel tolerates (ll_counted.hpp) is a caller's mistake here: a layout whose
    // blocks leave the expert's rows, a source's rows past its slot, unreachable slots.
    const uint64_t row_bytes = 2ull * p.hidden;
    for (int32_t s = 0; s < p.ranks; ++s) {
      int64_t messages = 0;
      for (int32_t e = 0; e < p.local_experts; ++e) {
        const int64_t range = p.layout_range[static_cast<int64_t>(e) * p.ranks + s];
        const int64_t first = ep::ll_range_first(range), count = ep::ll_range_count(range);
        require(first + count <= p.rows_per_expert, kPhase,
                "ll_return_counted: expert {}'s rows {}..{} from source {} are past its {} rows", e,
                first, first + count, s, p.rows_per_expert);
        messages += count;
      }
      require(messages <= p.slot_rows, kPhase,
              "ll_return_counted: source {} is sent back {} rows, its slot holds {}", s, messages,
              p.slot_rows);
      if (messages > 0 && p.to[s] != nullptr)
        core->require_reachable("ll_return_counted", "return slot", p.to[s],
                                static_cast<uint64_t>(messages) * row_bytes);
    }
    ep::ll_return_counted_on_host(p);
  });
}

void SimulatedDevice::ll_write_bytes(const ep::SizeWritesParams& p) {
  const char* error = ep::ll_write_bytes_error(p);
  require(error == nullptr, kPhase, "ll_write_bytes: {}", error != nullptr ? error : "");
  const Core& c = *core_;
  const auto count = static_cast<uint64_t>(p.count);
  c.require_reachable("ll_write_bytes", "writes", p.writes, sizeof(Descriptor) * count);
  c.require_reachable("ll_write_bytes", "groups", p.groups, 4 * count);
  core_->enqueue("ll_write_bytes", [p, core = core_.get()] {
    for (int64_t i = 0; i < p.count; ++i)
      if (p.groups[i] >= 0)
        core->require_reachable("ll_write_bytes", "counts",
                                p.counts + static_cast<int64_t>(p.groups[i]) * p.group_size,
                                4ull * static_cast<uint64_t>(p.group_size));
    ep::ll_write_bytes_on_host(p);
  });
}

void SimulatedDevice::ll_combine(const ep::LlCombineParams& p) {
  require(p.num_tokens >= 0 && p.topk >= 1 && p.topk <= ep::kLlMaxTopk && p.hidden > 0 &&
              p.hidden % ep::kLlScaleGroup == 0 && p.threads > 0 && p.threads % 32 == 0,
          kPhase, "ll_combine: inconsistent parameters");
  if (p.num_tokens == 0) return;
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const uint64_t row_bytes = 2ull * p.hidden;
  core_->require_reachable("ll_combine", "rows", p.rows, selections * sizeof(void*));
  core_->require_reachable("ll_combine", "weights", p.weights, selections * 4);
  core_->require_reachable("ll_combine", "out", p.out,
                           static_cast<uint64_t>(p.num_tokens) * row_bytes);
  require_aligned("ll_combine", "out", p.out, 16);
  core_->enqueue("ll_combine", [p, core = core_.get(), row_bytes] {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const uint16_t* const* rows = p.rows + t * p.topk;
      for (int k = 0; k < p.topk; ++k)
        if (rows[k] != nullptr) {
          core->require_reachable("ll_combine", "row", rows[k], row_bytes);
          require_aligned("ll_combine", "row", rows[k], 16);
        }
      ep::ll_combine_token(rows, p.weights + t * p.topk, p.topk, p.hidden, p.out + t * p.hidden,
                           ep::HostLanes{});
    }
  });
}

namespace {

// The stream's producer of one ring: a host RingProducer that only the stream's worker uses.
struct SimulatedRingProducer final : DeviceRingProducer {
  SimulatedRingProducer(const Ring& attached, const void* on_stream)
      : ring(attached), producer(attached), stream(on_stream) {}
  Ring ring;
  RingProducer producer;
  const void* stream;  // the Core it was attached on
};

}  // namespace

std::unique_ptr<DeviceRingProducer> SimulatedDevice::attach_ring(const Ring& ring) {
  require(ring.producer_mode() == ProducerMode::multi, kPhase,
          "attach_ring: a device pushes into multi-producer rings only (cuda/ring_producer.cuh)");
  core_->require_reachable("attach_ring", "the ring", &ring.header(),
                           Ring::bytes_for(ring.capacity()));
  return std::make_unique<SimulatedRingProducer>(ring, core_.get());
}

void SimulatedDevice::ring_push(DeviceRingProducer& producer, const Descriptor* descriptors,
                                int64_t count, std::chrono::milliseconds timeout) {
  auto* ring = dynamic_cast<SimulatedRingProducer*>(&producer);
  require(ring != nullptr && ring->stream == core_.get(), kPhase,
          "ring_push: the ring was not attached to this stream");
  require(count >= 0, kPhase, "ring_push: {} descriptors", count);
  if (count == 0) return;
  core_->require_reachable("ring_push", "descriptors", descriptors,
                           static_cast<uint64_t>(count) * sizeof(Descriptor));
  core_->enqueue("ring_push", [ring, descriptors, count, timeout] {
    for (int64_t i = 0; i < count; ++i) {
      if (ring->producer.push(descriptors[i], Deadline(timeout)) == Status::ok) continue;
      // As the GPU's producer gives up: the consumer stalls at the position it reserved, and
      // its health() says the producer failed; the rest of the batch is dropped.
      RingHeader& header = ring->ring.header();
      atomic(header.signal.abandoned)
          .store(atomic(header.producer.head).load(std::memory_order_acquire),
                 std::memory_order_release);
      return;
    }
  });
}

}  // namespace proxyep::gpu_side::device
