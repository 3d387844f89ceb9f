// LlNodeCombine (ll_node_combine.hpp).
#include "integrations/low_latency/ll_node_combine.hpp"

#include "common/error.hpp"
#include "gpu_side/device/device_table.hpp"

#include <string>
#include <utility>

namespace proxyep::integrations::low_latency {

// The step is the device's operations, spelled in its terms.
using namespace gpu_side;
using namespace gpu_side::device;

namespace {

void check_plan(const LlNodeDispatchPlan& d, const LlNodeCombinePlan& p, std::string_view phase) {
  const std::string where(phase);
  const uint64_t need = ll_node_return_slot_bytes(d.format.hidden, d.max_tokens, d.local_experts);
  require(p.slot_bytes >= need && p.slot_bytes % 16 == 0, where,
          "return slots of {} bytes: an expert rank's rows need {} (a multiple of 16)",
          p.slot_bytes, need);
  require(p.memory.size() == static_cast<size_t>(d.ranks), where,
          "the return memory of {} ranks for a node of {}", p.memory.size(), d.ranks);
  require(p.remote.empty() || p.remote.size() == static_cast<size_t>(d.ranks), where,
          "the remote homes of {} ranks for a group of {}", p.remote.size(), d.ranks);
  int64_t remotes = 0;
  for (int r = 0; r < d.ranks; ++r) {
    const bool dispatch_remote =
        !d.remote.empty() && d.remote[static_cast<size_t>(r)].send_slot != nullptr;
    const bool remote = !p.remote.empty() && p.remote[static_cast<size_t>(r)].send_slot != nullptr;
    require(remote == dispatch_remote, where,
            "rank {} is {} the dispatch's ranks on other nodes, {} the combine's", r,
            dispatch_remote ? "among" : "not among", remote ? "but among" : "nor among");
    if (remote) {
      const LlRemoteReturn& home = p.remote[static_cast<size_t>(r)];
      require(home.recv_slot != nullptr && home.arrived != nullptr && home.released != nullptr,
              where, "rank {} (another node): its receive memory or words are missing", r);
      require(is_aligned(home.send_slot, 16) && is_aligned(home.recv_slot, 16) &&
                  is_aligned(home.arrived, 8) && is_aligned(home.released, 8),
              where, "rank {} (another node): its memory is misaligned", r);
      ++remotes;
      continue;
    }
    const LlNodeReturnMemory& m = p.memory[static_cast<size_t>(r)];
    require(m.slots != nullptr && m.arrived != nullptr && m.released != nullptr, where,
            "rank {}'s return memory is missing", r);
    require(is_aligned(m.slots, 16) && is_aligned(m.arrived, 8) && is_aligned(m.released, 8), where,
            "rank {}'s return memory is misaligned (slots 16 bytes, words 8)", r);
  }
  if (remotes > 0)
    require(p.remote_sends.ring != nullptr &&
                p.remote_sends.sends.size() == static_cast<size_t>(remotes) &&
                p.remote_sends.releases.size() == static_cast<size_t>(remotes),
            where,
            "{} homes on other nodes need a ring, {} writes and {} releases (given {} and {})",
            remotes, remotes, remotes, p.remote_sends.sends.size(), p.remote_sends.releases.size());
  require(p.epoch != nullptr && is_aligned(p.epoch, 8), where,
          "the epoch word is missing or misaligned");
  require(p.x != nullptr && p.topk_weights != nullptr && p.out != nullptr, where,
          "an input or output tensor is missing");
  require(is_aligned(p.wait_stats, 8), where, "the statistics tensor is misaligned");
}

}  // namespace

uint64_t ll_node_return_slot_bytes(uint32_t hidden, int64_t max_tokens, int32_t local_experts) {
  return static_cast<uint64_t>(max_tokens) * static_cast<uint64_t>(local_experts) * 2ull * hidden;
}

LlNodeCombine::LlNodeCombine(std::shared_ptr<DeviceRuntime> device, const LlNodeDispatch& dispatch,
                             LlNodeCombinePlan plan, std::string_view phase)
    : device_(std::move(device)), dispatch_(dispatch), plan_(std::move(plan)) {
  const LlNodeDispatchPlan& d = dispatch_.plan();
  check_plan(d, plan_, phase);
  const SetupStream setup = setup_stream(device_);
  const auto ranks = static_cast<size_t>(d.ranks);
  std::vector<uint16_t*> to(ranks);
  std::vector<const uint16_t*> from(ranks);
  std::vector<int32_t> groups;  // the remote homes, in rank order: whose counts size their rows
  for (size_t r = 0; r < ranks; ++r) {
    if (remote(static_cast<int>(r))) {
      to[r] = reinterpret_cast<uint16_t*>(plan_.remote[r].send_slot);
      from[r] = reinterpret_cast<const uint16_t*>(plan_.remote[r].recv_slot);
      groups.push_back(static_cast<int32_t>(r));
      continue;
    }
    // Home r's slot for my rows; my slot for rank r's.
    to[r] = reinterpret_cast<uint16_t*>(plan_.memory[r].slots +
                                        static_cast<uint64_t>(d.rank) * plan_.slot_bytes);
    from[r] = reinterpret_cast<const uint16_t*>(plan_.memory[static_cast<size_t>(d.rank)].slots +
                                                r * plan_.slot_bytes);
  }
  to_slots_ = upload_table(*setup, to);
  from_slots_ = upload_table(*setup, from);
  remotes_ = static_cast<int64_t>(groups.size());
  if (remotes_ > 0) {
    sends_ = upload_table(*setup, plan_.remote_sends.sends);
    send_groups_ = upload_table(*setup, groups);
    releases_ = upload_table(*setup, plan_.remote_sends.releases);
  }
  setup->synchronize(phase, d.timeout);  // the vectors go at the end of the constructor
}

void LlNodeCombine::queue(std::string_view phase) {
  queue_send(phase);
  queue_receive(phase);
}

void LlNodeCombine::queue_send(std::string_view phase) {
  const LlNodeDispatchPlan& d = dispatch_.plan();
  const LlNodeCombinePlan& p = plan_;
  DeviceRuntime& device = *device_;
  const LlNodeReturnMemory& mine = p.memory[static_cast<size_t>(d.rank)];
  device.add_value(p.epoch, 1, phase);  // this step's number: n
  for (int r = 0; r < d.ranks; ++r)     // home r reduced my rows of step n - 1
    device.wait_value(remote(r) ? p.remote[static_cast<size_t>(r)].released : mine.released + r,
                      {p.epoch, -1}, d.timeout, phase);
  queue_kernel(device, &EpKernels::ll_return_counted,
               {.layout_range = d.layout_range,
                .x = p.x,
                .to = reinterpret_cast<uint16_t* const*>(to_slots_.get()),
                .ranks = d.ranks,
                .local_experts = d.local_experts,
                .rows_per_expert = static_cast<int64_t>(d.ranks) * d.max_tokens,
                .slot_rows = static_cast<int64_t>(p.slot_bytes / (2ull * d.format.hidden)),
                .hidden = d.format.hidden});
  for (int r = 0; r < d.ranks; ++r)
    if (!remote(r))
      device.write_value(p.memory[static_cast<size_t>(r)].arrived + d.rank, {p.epoch, 0}, phase);
  if (remotes_ > 0) {  // each home's rows: as many as the messages it sent (the counts table)
    auto* sends = reinterpret_cast<Descriptor*>(sends_.get());
    queue_kernel(device, &EpKernels::ll_write_bytes,
                 {.writes = sends,
                  .counts = d.memory[static_cast<size_t>(d.rank)].counts,
                  .groups = reinterpret_cast<const int32_t*>(send_groups_.get()),
                  .group_size = d.local_experts,
                  .unit_bytes = 2ull * d.format.hidden,
                  .max_bytes = p.slot_bytes,
                  .count = remotes_});
    device.ring_push(*p.remote_sends.ring, sends, remotes_, d.timeout);
  }
}

void LlNodeCombine::queue_receive(std::string_view phase) {
  const LlNodeDispatchPlan& d = dispatch_.plan();
  const LlNodeCombinePlan& p = plan_;
  DeviceRuntime& device = *device_;
  const LlNodeReturnMemory& mine = p.memory[static_cast<size_t>(d.rank)];
  for (int r = 0; r < d.ranks; ++r)  // rank r's rows of my tokens of step n are here
    device.wait_value(remote(r) ? p.remote[static_cast<size_t>(r)].arrived : mine.arrived + r,
                      {p.epoch, 0}, d.timeout, phase,
                      p.wait_stats != nullptr ? p.wait_stats + r : nullptr);
  queue_kernel(device, &EpKernels::ll_combine_routed,
               {.topk_idx = d.topk_idx,
                .positions = dispatch_.routed_positions(),
                .counts = dispatch_.routed_counts(),
                .from = reinterpret_cast<const uint16_t* const*>(from_slots_.get()),
                .weights = p.topk_weights,
                .out = p.out,
                .num_tokens = d.num_tokens,
                .topk = d.topk,
                .num_experts = d.ranks * d.local_experts,
                .local_experts = d.local_experts,
                .hidden = d.format.hidden});
  for (int r = 0; r < d.ranks; ++r)
    if (!remote(r))
      device.write_value(p.memory[static_cast<size_t>(r)].released + d.rank, {p.epoch, 0}, phase);
  if (remotes_ > 0)
    device.ring_push(*p.remote_sends.ring, reinterpret_cast<const Descriptor*>(releases_.get()),
                     remotes_, d.timeout);
}

}  // namespace proxyep::integrations::low_latency
