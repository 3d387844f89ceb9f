// Slot sizes and the size hint of low-latency calls (ll_sizes.hpp).
#include "integrations/low_latency/ll_sizes.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/ll_rules.hpp"

#include <algorithm>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

namespace {

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

uint64_t ll_slot_bytes(const LlShape& shape, int ranks) {
  const auto local = static_cast<uint64_t>(shape.experts / std::max(1, ranks));
  const auto T = static_cast<uint64_t>(shape.tokens);
  ep::LlFormat bf16{.hidden = static_cast<uint32_t>(shape.hidden), .fp8 = false};
  const uint64_t dispatch = local * T * bf16.message_bytes();
  const uint64_t combine = local * T * 2 * static_cast<uint64_t>(shape.hidden);
  return align_up(std::max(dispatch, combine), 64);
}

int64_t ll_size_hint(const LlShape& shape, int ranks) {
  return static_cast<int64_t>(
      align_up(2 * static_cast<uint64_t>(ranks) * ll_slot_bytes(shape, ranks), 128));
}

uint64_t ll_slot_from_rdma_bytes(int64_t num_rdma_bytes, int ranks) {
  if (num_rdma_bytes <= 0 || ranks < 1) return 0;
  return static_cast<uint64_t>(num_rdma_bytes) / (2 * static_cast<uint64_t>(ranks)) / 64 * 64;
}

void check_shape(const LlShape& s, int ranks, std::string_view phase) {
  require(s.tokens >= 1, phase, "num_max_dispatch_tokens_per_rank must be >= 1; got {}", s.tokens);
  require(s.hidden > 0 && s.hidden % ep::kScaleBlock == 0, phase,
          "hidden must be a positive multiple of {} (FP8 dispatch needs a multiple of 512); got {}",
          ep::kScaleBlock, s.hidden);
  require(s.experts >= ranks && s.experts % ranks == 0, phase,
          "num_experts ({}) must be a positive multiple of the number of ranks ({})", s.experts,
          ranks);
  require(s.experts / ranks <= ep::kMaxLocalExperts, phase,
          "{} experts per rank exceed the limit of {}", s.experts / ranks, ep::kMaxLocalExperts);
}

}  // namespace proxyep::integrations::low_latency
