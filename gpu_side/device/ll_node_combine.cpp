// LlNodeCombine (ll_node_combine.hpp).
#include "gpu_side/device/ll_node_combine.hpp"

#include "common/error.hpp"
#include "gpu_side/device/device_table.hpp"

#include <string>
#include <utility>

namespace proxyep::gpu_side::device {

namespace {

void check_plan(const LlNodeDispatchPlan& d, const LlNodeCombinePlan& p, std::string_view phase) {
  const std::string where(phase);
  const uint64_t need = ll_node_return_slot_bytes(d.format.hidden, d.max_tokens, d.local_experts);
  require(p.slot_bytes >= need && p.slot_bytes % 16 == 0, where,
          "return slots of {} bytes: an expert rank's rows need {} (a multiple of 16)",
          p.slot_bytes, need);
  require(p.memory.size() == static_cast<size_t>(d.ranks), where,
          "the return memory of {} ranks for a node of {}", p.memory.size(), d.ranks);
  for (int r = 0; r < d.ranks; ++r) {
    const LlNodeReturnMemory& m = p.memory[static_cast<size_t>(r)];
    require(m.slots != nullptr && m.arrived != nullptr && m.released != nullptr, where,
            "rank {}'s return memory is missing", r);
    require(is_aligned(m.slots, 16) && is_aligned(m.arrived, 8) && is_aligned(m.released, 8), where,
            "rank {}'s return memory is misaligned (slots 16 bytes, words 8)", r);
  }
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
  for (size_t r = 0; r < ranks; ++r) {
    // Home r's slot for my rows; my slot for rank r's.
    to[r] = reinterpret_cast<uint16_t*>(plan_.memory[r].slots +
                                        static_cast<uint64_t>(d.rank) * plan_.slot_bytes);
    from[r] = reinterpret_cast<const uint16_t*>(plan_.memory[static_cast<size_t>(d.rank)].slots +
                                                r * plan_.slot_bytes);
  }
  to_slots_ = upload_table(*setup, to);
  from_slots_ = upload_table(*setup, from);
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
    device.wait_value(mine.released + r, {p.epoch, -1}, d.timeout, phase);
  device.ll_return_counted(
      {.layout_range = d.layout_range,
       .x = p.x,
       .to = reinterpret_cast<uint16_t* const*>(to_slots_.get()),
       .ranks = d.ranks,
       .local_experts = d.local_experts,
       .rows_per_expert = static_cast<int64_t>(d.ranks) * d.max_tokens,
       .slot_rows = static_cast<int64_t>(p.slot_bytes / (2ull * d.format.hidden)),
       .hidden = d.format.hidden});
  for (int r = 0; r < d.ranks; ++r)
    device.write_value(p.memory[static_cast<size_t>(r)].arrived + d.rank, {p.epoch, 0}, phase);
}

void LlNodeCombine::queue_receive(std::string_view phase) {
  const LlNodeDispatchPlan& d = dispatch_.plan();
  const LlNodeCombinePlan& p = plan_;
  DeviceRuntime& device = *device_;
  const LlNodeReturnMemory& mine = p.memory[static_cast<size_t>(d.rank)];
  for (int r = 0; r < d.ranks; ++r)  // rank r's rows of my tokens of step n are here
    device.wait_value(mine.arrived + r, {p.epoch, 0}, d.timeout, phase,
                      p.wait_stats != nullptr ? p.wait_stats + r : nullptr);
  device.ll_combine_routed({.topk_idx = d.topk_idx,
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
    device.write_value(p.memory[static_cast<size_t>(r)].released + d.rank, {p.epoch, 0}, phase);
}

}  // namespace proxyep::gpu_side::device
