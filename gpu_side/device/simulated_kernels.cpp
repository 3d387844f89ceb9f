// The host-simulated device's EP kernels (ep_kernels.hpp): each checks its parameters and every
// address it is given at once, then queues its CPU twin (gpu_side/ep) on the stream's worker,
// which checks again the addresses it reads from device tables as it runs.
#include "gpu_side/device/simulated_kernels.hpp"

#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/device/simulated_device_core.hpp"
#include "gpu_side/ep/layout_rules.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>

namespace proxyep::gpu_side::device {

namespace {

constexpr std::string_view kPhase = kSimulatedPhase;
using Core = SimulatedDevice::Core;

// The stream a kernel is queued on: the table is handed out only with a SimulatedDevice
// (SimulatedDevice::kernels), which queue_kernel keeps together with it.
Core& core_of(DeviceRuntime& stream) {
  return static_cast<SimulatedDevice&>(stream).core();
}

// What a kernel's loads and stores need of an address (16: the int4 copies of rows; 8 and 4:
// the int64 and float fields): on a GPU a misaligned one is cudaErrorMisalignedAddress, which
// ends the context, so the simulated device refuses it.
void require_aligned(std::string_view op, std::string_view what, const void* at,
                     uintptr_t alignment) {
  require(reinterpret_cast<uintptr_t>(at) % alignment == 0, kPhase,
          "{}: {} at {} is not {}-byte aligned", op, what, at, alignment);
}

void dispatch_layout(DeviceRuntime& stream, const ep::LayoutParams& p) {
  Core& core = core_of(stream);
  const ep::EpShape& s = p.shape;
  require(s.num_ranks >= 1 && s.ranks_per_node >= 1 && s.num_experts >= 1 &&
              s.num_experts % s.num_ranks == 0 && p.num_tokens >= 0 && p.topk >= 0 &&
              p.topk <= ep::kMaxTopk,
          kPhase, "dispatch_layout: inconsistent parameters");
  const Core& c = core;
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
  core.enqueue("dispatch_layout", [p] {
    const ep::EpShape& s = p.shape;
    std::memset(p.tokens_per_rank, 0, 4ull * s.num_ranks);
    if (p.tokens_per_node != nullptr) std::memset(p.tokens_per_node, 0, 4ull * s.num_nodes());
    std::memset(p.tokens_per_expert, 0, 4ull * s.num_experts);
    for (int64_t t = 0; t < p.num_tokens; ++t)
      ep::count_token(p.topk_idx + t * p.topk, p.topk, s, p.tokens_per_rank, p.tokens_per_node,
                      p.tokens_per_expert, p.is_token_in_rank + t * s.num_ranks);
  });
}

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

void dispatch_rows(DeviceRuntime& stream, const ep::DispatchParams& p) {
  Core& core = core_of(stream);
  const int ranks = p.input.shape.num_ranks;
  require(ranks >= 1 && p.num_tokens >= 0 && p.threads > 0 && p.threads % 32 == 0, kPhase,
          "dispatch_rows: inconsistent parameters");
  const auto tokens = static_cast<uint64_t>(p.num_tokens);
  core.require_reachable("dispatch_rows", "send_head", p.send_head, tokens * ranks * 4);
  core.require_reachable("dispatch_rows", "sinks", p.sinks, sizeof(ep::RowSink) * ranks);
  core.enqueue("dispatch_rows", [p, core = &core] {
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

void dispatch_chunk(DeviceRuntime& stream, const ep::ChunkParams& p) {
  Core& core = core_of(stream);
  require(p.rows >= 0 && p.threads > 0 && p.threads % 32 == 0, kPhase,
          "dispatch_chunk: inconsistent parameters");
  if (p.rows == 0) return;
  core.require_reachable("dispatch_chunk", "tokens", p.tokens, static_cast<uint64_t>(p.rows) * 4);
  core.enqueue("dispatch_chunk", [p, core = &core] {
    for (int64_t i = 0; i < p.rows; ++i) {
      check_row(*core, "dispatch_chunk", p.input, p.sink, i, p.tokens[i]);
      ep::dispatch_row(p.input, p.sink, i, p.tokens[i], ep::HostLanes{});
    }
  });
}

void combine(DeviceRuntime& stream, const ep::CombineParams& p) {
  Core& core = core_of(stream);
  const ep::CombineInput& in = p.input;
  require(in.num_ranks >= 1 && in.hidden > 0 && in.hidden % ep::kCombineChunk == 0 &&
              in.topk >= 0 && p.num_tokens >= 0 && p.threads > 0 && p.threads % 32 == 0,
          kPhase, "combine: inconsistent parameters");
  const auto tokens = static_cast<uint64_t>(p.num_tokens);
  const auto ranks = static_cast<uint64_t>(in.num_ranks);
  const uint64_t row_bytes = static_cast<uint64_t>(in.hidden) * 2;
  const Core& c = core;
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
  // V2's tables (row_rules.hpp): device addresses like send_head.
  if (in.order != nullptr) c.require_reachable("combine", "order", in.order, tokens * ranks * 4);
  if (in.weight_owner != nullptr && in.topk > 0)
    c.require_reachable("combine", "weight_owner", in.weight_owner, tokens * in.topk * 4);
  core.enqueue("combine", [p, core = &core, row_bytes] {
    const ep::CombineInput& in = p.input;
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      // A GPU would read past the per-rank tables on a group out of range; refuse it here.
      for (int i = 0; in.order != nullptr && i < in.num_ranks; ++i) {
        const int32_t g = in.order[t * in.num_ranks + i];
        if (g < 0) break;
        require(g < in.num_ranks, kPhase, "combine: order[{}][{}] = {} is not a group below {}", t,
                i, g, in.num_ranks);
      }
      for (int k = 0; in.weight_owner != nullptr && k < in.topk; ++k) {
        const int32_t g = in.weight_owner[t * in.topk + k];
        require(g >= -1 && g < in.num_ranks, kPhase,
                "combine: weight_owner[{}][{}] = {} is not -1 or a group below {}", t, k, g,
                in.num_ranks);
      }
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

void add(DeviceRuntime& stream, const ep::AddParams& p) {
  Core& core = core_of(stream);
  require(p.count >= 0, kPhase, "add: inconsistent parameters");
  if (p.count == 0) return;
  const uint64_t bytes = static_cast<uint64_t>(p.count) * (p.wide ? 8 : 4);
  core.require_reachable("add", "to", p.to, bytes);
  core.require_reachable("add", "from", p.from, bytes);
  core.enqueue("add", [p] {
    for (int64_t i = 0; i < p.count; ++i)
      if (p.wide)
        static_cast<int64_t*>(p.to)[i] += static_cast<const int64_t*>(p.from)[i];
      else
        static_cast<int32_t*>(p.to)[i] += static_cast<const int32_t*>(p.from)[i];
  });
}

void copy_runs(DeviceRuntime& stream, const ep::CopyRunsParams& p) {
  Core& core = core_of(stream);
  require(p.num_runs >= 0, kPhase, "copy_runs: inconsistent parameters");
  if (p.num_runs == 0) return;
  core.require_reachable("copy_runs", "runs", p.runs,
                         static_cast<uint64_t>(p.num_runs) * sizeof(ep::CopyRun));
  core.enqueue("copy_runs", [p, core = &core] {
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

void ll_pack(DeviceRuntime& stream, const ep::LlPackParams& p) {
  Core& core = core_of(stream);
  require(ep::ll_format_error(p.format) == nullptr && p.num_items >= 0 && p.threads > 0 &&
              p.threads % 32 == 0,
          kPhase, "ll_pack: inconsistent parameters");
  if (p.num_items == 0) return;
  core.require_reachable("ll_pack", "items", p.items,
                         static_cast<uint64_t>(p.num_items) * sizeof(ep::LlPackItem));
  core.enqueue("ll_pack", [p, core = &core] {
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

void ll_route(DeviceRuntime& stream, const ep::LlRouteParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_route_error(p);
  require(error == nullptr, kPhase, "ll_route: {}", error != nullptr ? error : "");
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const Core& c = core;
  c.require_reachable("ll_route", "topk_idx", p.topk_idx, 8 * selections);
  c.require_reachable("ll_route", "positions", p.positions, 4 * selections);
  c.require_reachable("ll_route", "counts", p.counts, 4ull * static_cast<uint64_t>(p.num_experts));
  c.require_reachable("ll_route", "invalid", p.invalid, 4);
  core.enqueue("ll_route", [p] { ep::ll_route_on_host(p); });
}

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

void ll_pack_routed(DeviceRuntime& stream, const ep::LlPackRoutedParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_pack_routed_error(p);
  require(error == nullptr, kPhase, "ll_pack_routed: {}", error != nullptr ? error : "");
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  if (selections == 0) return;
  core.require_reachable("ll_pack_routed", "x", p.x,
                         2ull * p.format.hidden * static_cast<uint64_t>(p.num_tokens));
  require_routing_reachable(core, "ll_pack_routed", p.topk_idx, p.positions, p.counts, p.slots,
                            selections, p.num_experts, p.local_experts);
  core.enqueue("ll_pack_routed", [p, core = &core, selections] {
    require_routed_places(*core, "ll_pack_routed", "message", p.topk_idx, p.positions, selections,
                          p.num_experts, p.format.message_bytes(),
                          [&p](int64_t i) { return ep::ll_routed_destination(p, i); });
    ep::ll_pack_routed_on_host(p);
  });
}

void ll_combine_routed(DeviceRuntime& stream, const ep::LlCombineRoutedParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_combine_routed_error(p);
  require(error == nullptr, kPhase, "ll_combine_routed: {}", error != nullptr ? error : "");
  if (p.num_tokens == 0) return;
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const uint64_t row_bytes = 2ull * p.hidden;
  require_routing_reachable(core, "ll_combine_routed", p.topk_idx, p.positions, p.counts, p.from,
                            selections, p.num_experts, p.local_experts);
  core.require_reachable("ll_combine_routed", "weights", p.weights, selections * 4);
  core.require_reachable("ll_combine_routed", "out", p.out,
                         static_cast<uint64_t>(p.num_tokens) * row_bytes);
  core.enqueue("ll_combine_routed", [p, core = &core, selections, row_bytes] {
    require_routed_places(*core, "ll_combine_routed", "row", p.topk_idx, p.positions, selections,
                          p.num_experts, row_bytes,
                          [&p](int64_t i) { return ep::ll_routed_row(p, i); });
    ep::ll_combine_routed_on_host(p);
  });
}

void count_mismatches(DeviceRuntime& stream, const ep::MismatchParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::mismatch_error(p);
  require(error == nullptr, kPhase, "count_mismatches: {}", error != nullptr ? error : "");
  const auto bytes = 8 * static_cast<uint64_t>(p.count);
  const Core& c = core;
  c.require_reachable("count_mismatches", "a", p.a, bytes);
  c.require_reachable("count_mismatches", "b", p.b, bytes);
  c.require_reachable("count_mismatches", "mismatches", p.mismatches, 4);
  core.enqueue("count_mismatches", [p] { ep::count_mismatches_on_host(p); });
}

void ll_unpack_counted(DeviceRuntime& stream, const ep::LlUnpackCountedParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_unpack_counted_error(p);
  require(error == nullptr, kPhase, "ll_unpack_counted: {}", error != nullptr ? error : "");
  const auto R = static_cast<uint64_t>(p.ranks), L = static_cast<uint64_t>(p.local_experts);
  const Core& c = core;
  c.require_reachable("ll_unpack_counted", "counts", p.counts, 4 * R * L);
  c.require_reachable("ll_unpack_counted", "from", p.from, sizeof(void*) * R);
  c.require_reachable("ll_unpack_counted", "sinks", p.sinks, sizeof(ep::LlExpertSink) * L);
  c.require_reachable("ll_unpack_counted", "recv_count", p.recv_count, 4 * L);
  c.require_reachable("ll_unpack_counted", "layout_range", p.layout_range, 8 * R * L);
  core.enqueue("ll_unpack_counted", [p, core = &core] {
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

void ll_return_counted(DeviceRuntime& stream, const ep::LlReturnCountedParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_return_counted_error(p);
  require(error == nullptr, kPhase, "ll_return_counted: {}", error != nullptr ? error : "");
  const auto R = static_cast<uint64_t>(p.ranks), L = static_cast<uint64_t>(p.local_experts);
  const Core& c = core;
  c.require_reachable("ll_return_counted", "layout_range", p.layout_range, 8 * R * L);
  c.require_reachable("ll_return_counted", "to", p.to, sizeof(void*) * R);
  c.require_reachable("ll_return_counted", "x", p.x,
                      2ull * p.hidden * L * static_cast<uint64_t>(p.rows_per_expert));
  core.enqueue("ll_return_counted", [p, core = &core] {
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

void ll_write_bytes(DeviceRuntime& stream, const ep::SizeWritesParams& p) {
  Core& core = core_of(stream);
  const char* error = ep::ll_write_bytes_error(p);
  require(error == nullptr, kPhase, "ll_write_bytes: {}", error != nullptr ? error : "");
  const Core& c = core;
  const auto count = static_cast<uint64_t>(p.count);
  c.require_reachable("ll_write_bytes", "writes", p.writes, sizeof(Descriptor) * count);
  c.require_reachable("ll_write_bytes", "groups", p.groups, 4 * count);
  core.enqueue("ll_write_bytes", [p, core = &core] {
    for (int64_t i = 0; i < p.count; ++i)
      if (p.groups[i] >= 0)
        core->require_reachable("ll_write_bytes", "counts",
                                p.counts + static_cast<int64_t>(p.groups[i]) * p.group_size,
                                4ull * static_cast<uint64_t>(p.group_size));
    ep::ll_write_bytes_on_host(p);
  });
}

void ll_combine(DeviceRuntime& stream, const ep::LlCombineParams& p) {
  Core& core = core_of(stream);
  require(p.num_tokens >= 0 && p.topk >= 1 && p.topk <= ep::kLlMaxTopk && p.hidden > 0 &&
              p.hidden % ep::kLlScaleGroup == 0 && p.threads > 0 && p.threads % 32 == 0,
          kPhase, "ll_combine: inconsistent parameters");
  if (p.num_tokens == 0) return;
  const auto selections = static_cast<uint64_t>(p.num_tokens) * static_cast<uint64_t>(p.topk);
  const uint64_t row_bytes = 2ull * p.hidden;
  core.require_reachable("ll_combine", "rows", p.rows, selections * sizeof(void*));
  core.require_reachable("ll_combine", "weights", p.weights, selections * 4);
  core.require_reachable("ll_combine", "out", p.out,
                         static_cast<uint64_t>(p.num_tokens) * row_bytes);
  require_aligned("ll_combine", "out", p.out, 16);
  core.enqueue("ll_combine", [p, core = &core, row_bytes] {
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

}  // namespace

const EpKernels& simulated_kernels() {
  static const EpKernels table{
      .dispatch_layout = dispatch_layout,
      .dispatch_rows = dispatch_rows,
      .dispatch_chunk = dispatch_chunk,
      .combine = combine,
      .add = add,
      .copy_runs = copy_runs,
      .ll_pack = ll_pack,
      .ll_combine = ll_combine,
      .ll_route = ll_route,
      .ll_pack_routed = ll_pack_routed,
      .ll_combine_routed = ll_combine_routed,
      .ll_unpack_counted = ll_unpack_counted,
      .ll_return_counted = ll_return_counted,
      .count_mismatches = count_mismatches,
      .ll_write_bytes = ll_write_bytes,
  };
  return table;
}

}  // namespace proxyep::gpu_side::device
