// LlNodeDispatch (ll_node_dispatch.hpp).
#include "integrations/low_latency/ll_node_dispatch.hpp"

#include "common/error.hpp"
#include "gpu_side/device/device_table.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace proxyep::integrations::low_latency {

// The step is the device's operations, spelled in its terms.
using namespace gpu_side;
using namespace gpu_side::device;

namespace {

void check_plan(const LlNodeDispatchPlan& p, std::string_view phase) {
  const std::string where(phase);
  require(p.ranks >= 1 && p.rank >= 0 && p.rank < p.ranks, where,
          "rank {} is not in a node of {} ranks", p.rank, p.ranks);
  require(p.local_experts >= 1 && p.local_experts <= ep::kMaxLocalExperts, where,
          "{} local experts (1..{})", p.local_experts, ep::kMaxLocalExperts);
  if (const char* error = ep::ll_format_error(p.format); error != nullptr)
    fail(where, "the format: {}", error);
  require(p.topk >= 1 && p.topk <= ep::kLlMaxTopk, where, "topk {} (1..{})", p.topk,
          ep::kLlMaxTopk);
  require(p.max_tokens >= 1 && p.num_tokens >= 0 && p.num_tokens <= p.max_tokens, where,
          "{} tokens with num_max_dispatch_tokens_per_rank {}", p.num_tokens, p.max_tokens);
  const uint64_t need = ll_node_slot_bytes(p.format, p.max_tokens, p.local_experts);
  require(p.slot_bytes >= need && p.slot_bytes % 16 == 0, where,
          "slots of {} bytes: a source's messages need {} (a multiple of 16)", p.slot_bytes, need);
  require(p.memory.size() == static_cast<size_t>(p.ranks), where,
          "the memory of {} ranks for a node of {}", p.memory.size(), p.ranks);
  require(p.remote.empty() || p.remote.size() == static_cast<size_t>(p.ranks), where,
          "the remote peers of {} ranks for a group of {}", p.remote.size(), p.ranks);
  int64_t remotes = 0;
  for (int r = 0; r < p.ranks; ++r) {
    if (!p.remote.empty() && p.remote[static_cast<size_t>(r)].send_slot != nullptr) {
      const LlRemotePeer& peer = p.remote[static_cast<size_t>(r)];
      require(r != p.rank, where, "rank {} is this rank, not a peer on another node", r);
      require(peer.send_counts != nullptr && peer.recv_slot != nullptr &&
                  peer.recv_counts != nullptr && peer.arrived != nullptr &&
                  peer.released != nullptr,
              where, "rank {} (another node): its send or receive memory or words are missing", r);
      require(is_aligned(peer.send_slot, 16) && is_aligned(peer.recv_slot, 16) &&
                  is_aligned(peer.send_counts, 4) && is_aligned(peer.recv_counts, 4) &&
                  is_aligned(peer.arrived, 8) && is_aligned(peer.released, 8),
              where, "rank {} (another node): its memory is misaligned", r);
      ++remotes;
      continue;
    }
    const LlNodeMemory& m = p.memory[static_cast<size_t>(r)];
    require(
        m.slots != nullptr && m.counts != nullptr && m.arrived != nullptr && m.released != nullptr,
        where, "rank {}'s step memory is missing", r);
    require(is_aligned(m.slots, 16) && is_aligned(m.counts, 4) && is_aligned(m.arrived, 8) &&
                is_aligned(m.released, 8),
            where, "rank {}'s step memory is misaligned (slots 16 bytes, words 8)", r);
  }
  if (remotes > 0)
    require(p.remote_sends.ring != nullptr &&
                p.remote_sends.sends.size() == static_cast<size_t>(kLlDispatchWrites * remotes) &&
                p.remote_sends.releases.size() == static_cast<size_t>(remotes),
            where,
            "{} peers on other nodes need a ring, {} writes and {} releases (given {} and {})",
            remotes, kLlDispatchWrites * remotes, remotes, p.remote_sends.sends.size(),
            p.remote_sends.releases.size());
  require(p.epoch != nullptr && is_aligned(p.epoch, 8), where,
          "the epoch word is missing or misaligned");
  require(p.timeout.count() > 0, where, "the step's waits need a timeout");
  require(p.x != nullptr && p.topk_idx != nullptr && p.recv_x != nullptr && p.src_info != nullptr &&
              p.recv_count != nullptr && p.layout_range != nullptr &&
              (!p.format.fp8 || p.recv_x_scales != nullptr),
          where, "an input or output tensor is missing");
  require(is_aligned(p.recv_stats, 4) && is_aligned(p.wait_stats, 8), where,
          "a statistics tensor is misaligned");
}

}  // namespace

uint64_t ll_node_slot_bytes(const ep::LlFormat& format, int64_t max_tokens, int32_t local_experts) {
  return static_cast<uint64_t>(max_tokens) * static_cast<uint64_t>(local_experts) *
         format.message_bytes();
}

LlNodeDispatch::LlNodeDispatch(std::shared_ptr<DeviceRuntime> device, LlNodeDispatchPlan plan,
                               std::string_view phase)
    : device_(std::move(device)), plan_(std::move(plan)) {
  check_plan(plan_, phase);
  const LlNodeDispatchPlan& p = plan_;
  const SetupStream setup = setup_stream(device_);
  const auto ranks = static_cast<size_t>(p.ranks);
  const int32_t experts = p.ranks * p.local_experts;
  counts_ = setup->allocate(4ull * static_cast<uint64_t>(experts));
  positions_ =
      setup->allocate(std::max<uint64_t>(16, 4ull * static_cast<uint64_t>(p.num_tokens * p.topk)));
  invalid_ = setup->allocate(16);

  std::vector<std::byte*> to(ranks), from(ranks);
  std::vector<int32_t> groups;  // the remote peers, in rank order: whose counts size their writes
  for (size_t r = 0; r < ranks; ++r) {
    if (remote(static_cast<int>(r))) {
      to[r] = p.remote[r].send_slot;
      from[r] = const_cast<std::byte*>(p.remote[r].recv_slot);
      groups.push_back(static_cast<int32_t>(r));
      continue;
    }
    to[r] = p.memory[r].slots + static_cast<uint64_t>(p.rank) * p.slot_bytes;  // peer r's, mine
    from[r] = p.memory[static_cast<size_t>(p.rank)].slots + r * p.slot_bytes;
  }
  remotes_ = static_cast<int64_t>(groups.size());
  if (remotes_ > 0) {
    sends_ = upload_table(*setup, p.remote_sends.sends);
    send_groups_ = upload_table(*setup, groups);
    releases_ = upload_table(*setup, p.remote_sends.releases);
  }
  const int64_t rows = static_cast<int64_t>(p.ranks) * p.max_tokens;  // per local expert
  const uint32_t scale_words = p.format.scale_words();
  std::vector<ep::LlExpertSink> sinks(static_cast<size_t>(p.local_experts));
  for (int32_t e = 0; e < p.local_experts; ++e) {
    ep::LlExpertSink& sink = sinks[static_cast<size_t>(e)];
    sink.x = p.recv_x + static_cast<uint64_t>(e * rows) * p.format.payload_bytes();
    if (scale_words > 0)
      sink.scales = p.recv_x_scales + static_cast<uint64_t>(e) * scale_words * rows;
    sink.scale_stride = rows;
    sink.src_info = p.src_info + e * rows;
  }
  to_slots_ = upload_table(*setup, to);
  from_slots_ = upload_table(*setup, from);
  sinks_ = upload_table(*setup, sinks);
  setup->synchronize(phase, p.timeout);  // the vectors go at the end of the constructor
}

void LlNodeDispatch::queue(std::string_view phase) {
  queue_send(phase);
  queue_receive(phase);
}

void LlNodeDispatch::queue_send(std::string_view phase) {
  const LlNodeDispatchPlan& p = plan_;
  DeviceRuntime& d = *device_;
  const LlNodeMemory& mine = p.memory[static_cast<size_t>(p.rank)];
  auto* counts = reinterpret_cast<int32_t*>(counts_.get());
  auto* positions = reinterpret_cast<int32_t*>(positions_.get());
  d.add_value(p.epoch, 1, phase);  // this step's number: n
  queue_kernel(d, &EpKernels::ll_route,
               {.topk_idx = p.topk_idx,
                .num_tokens = p.num_tokens,
                .topk = p.topk,
                .num_experts = p.ranks * p.local_experts,
                .counts = counts,
                .positions = positions,
                .invalid = reinterpret_cast<int32_t*>(invalid_.get())});
  for (int r = 0; r < p.ranks; ++r)  // rank r read my messages of step n - 1
    d.wait_value(remote(r) ? p.remote[static_cast<size_t>(r)].released : mine.released + r,
                 {p.epoch, -1}, p.timeout, phase);
  queue_kernel(d, &EpKernels::ll_pack_routed,
               {.format = p.format,
                .x = p.x,
                .topk_idx = p.topk_idx,
                .positions = positions,
                .counts = counts,
                .slots = reinterpret_cast<std::byte* const*>(to_slots_.get()),
                .num_tokens = p.num_tokens,
                .topk = p.topk,
                .num_experts = p.ranks * p.local_experts,
                .local_experts = p.local_experts});
  const uint64_t row_bytes = 4ull * static_cast<uint64_t>(p.local_experts);
  for (int r = 0; r < p.ranks; ++r) {
    if (remote(r)) {  // beside the messages, written with them below
      d.copy(p.remote[static_cast<size_t>(r)].send_counts, counts + r * p.local_experts, row_bytes);
      continue;
    }
    const LlNodeMemory& peer = p.memory[static_cast<size_t>(r)];
    d.copy(peer.counts + p.rank * p.local_experts, counts + r * p.local_experts, row_bytes);
    d.write_value(peer.arrived + p.rank, {p.epoch, 0}, phase);
  }
  if (remotes_ > 0) {  // the messages' lengths from the counts, then the writes, in order
    auto* sends = reinterpret_cast<Descriptor*>(sends_.get());
    queue_kernel(d, &EpKernels::ll_write_bytes,
                 {.writes = sends,
                  .counts = counts,
                  .groups = reinterpret_cast<const int32_t*>(send_groups_.get()),
                  .group_size = p.local_experts,
                  .unit_bytes = p.format.message_bytes(),
                  .max_bytes = p.slot_bytes,
                  .count = remotes_});
    d.ring_push(*p.remote_sends.ring, sends, static_cast<int64_t>(kLlDispatchWrites) * remotes_,
                p.timeout);
  }
}

void LlNodeDispatch::queue_receive(std::string_view phase) {
  const LlNodeDispatchPlan& p = plan_;
  DeviceRuntime& d = *device_;
  const LlNodeMemory& mine = p.memory[static_cast<size_t>(p.rank)];
  const uint64_t row_bytes = 4ull * static_cast<uint64_t>(p.local_experts);
  for (int s = 0; s < p.ranks; ++s) {  // source s's messages of step n are here
    int64_t* waited = p.wait_stats != nullptr ? p.wait_stats + s : nullptr;
    if (remote(s)) {  // both its writes of step n counted: its counts row into the table
      const LlRemotePeer& peer = p.remote[static_cast<size_t>(s)];
      d.wait_value(peer.arrived, {p.epoch, 0, kLlDispatchWrites}, p.timeout, phase, waited);
      d.copy(mine.counts + s * p.local_experts, peer.recv_counts, row_bytes);
    } else {
      d.wait_value(mine.arrived + s, {p.epoch, 0}, p.timeout, phase, waited);
    }
  }
  queue_kernel(d, &EpKernels::ll_unpack_counted,
               {.format = p.format,
                .counts = mine.counts,
                .from = reinterpret_cast<const std::byte* const*>(from_slots_.get()),
                .sinks = reinterpret_cast<const ep::LlExpertSink*>(sinks_.get()),
                .recv_count = p.recv_count,
                .layout_range = p.layout_range,
                .ranks = p.ranks,
                .local_experts = p.local_experts,
                .rows_per_expert = static_cast<int64_t>(p.ranks) * p.max_tokens});
  for (int s = 0; s < p.ranks; ++s)
    if (!remote(s))
      d.write_value(p.memory[static_cast<size_t>(s)].released + p.rank, {p.epoch, 0}, phase);
  if (remotes_ > 0)
    d.ring_push(*p.remote_sends.ring, reinterpret_cast<const Descriptor*>(releases_.get()),
                remotes_, p.timeout);
  if (p.recv_stats != nullptr)
    queue_kernel(
        d, &EpKernels::add,
        {.wide = false, .to = p.recv_stats, .from = p.recv_count, .count = p.local_experts});
}

}  // namespace proxyep::integrations::low_latency
