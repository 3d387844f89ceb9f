#include "integrations/session_sizes.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "integrations/low_latency/ll_record.hpp"
#include "integrations/low_latency/ll_sizes.hpp"
#include "integrations/normal/notify_record.hpp"
#include "proxy/session/peer_channel.hpp"

#include <algorithm>

namespace proxyep::integrations {
namespace {

constexpr const char* kPhase = "buffer";

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

proxy::SessionSizes session_sizes(const BufferOptions& opts, int ranks, int ranks_per_node) {
  require(!opts.enable_shrink || opts.low_latency_mode, kPhase,
          "enable_shrink (rank masking) needs low_latency_mode=True (as in DeepEP)");
  // Nodes hold consecutive ranks; the last one may be smaller (3 ranks, 2 per node: {0, 1}, {2}).
  require(ranks_per_node >= 1, kPhase, "ranks_per_node must be >= 1; got {}", ranks_per_node);
  const bool ll = opts.low_latency_mode;
  require((ll ? opts.num_nvl_bytes >= 0 : opts.num_nvl_bytes > 0) && opts.num_nvl_bytes % 128 == 0,
          kPhase,
          "num_nvl_bytes must be a {} multiple of 128 (this backend receives normal-mode rows "
          "into it); got {}",
          ll ? "non-negative" : "positive", opts.num_nvl_bytes);
  require(opts.num_rdma_bytes >= 0 && opts.num_rdma_bytes % 128 == 0, kPhase,
          "num_rdma_bytes must be a non-negative multiple of 128; got {}", opts.num_rdma_bytes);
  require(!ll || opts.num_rdma_bytes > 0, kPhase,
          "low_latency_mode needs num_rdma_bytes > 0 (it holds the low-latency slots; see "
          "Buffer::get_low_latency_rdma_size_hint)");
  require(ranks <= ranks_per_node || opts.num_rdma_bytes > 0, kPhase,
          "the group spans {} nodes of {} ranks: num_rdma_bytes must be > 0 (it stages the rows "
          "sent to other nodes; see Buffer::rdma_bytes_hint)",
          (ranks + ranks_per_node - 1) / ranks_per_node, ranks_per_node);
  proxy::SessionSizes s;
  s.ranks = ranks;
  // Without NVLink for LL calls, every peer is reached through the fabric (one rank per node).
  s.ranks_per_node = ll && !opts.allow_nvlink_for_low_latency_mode ? 1 : ranks_per_node;
  s.record_bytes =
      align_up(proxy::kRecordWordBytes + std::max(normal::record_payload_bytes(ranks),
                                                  low_latency::ll_record_payload_bytes()),
               proxy::kSlotAlignment);
  // Each pair's eager slot from the per-area budget: a group of R ranks has 2R slots per area (two
  // calls in flight), and its pairs' rows shrink as R grows, so the slots may too.
  const auto eager_cap = static_cast<uint64_t>(std::max<int64_t>(0, params::ep_eager_bytes.get()));
  const auto eager_budget =
      static_cast<uint64_t>(std::max<int64_t>(0, params::ep_eager_budget_bytes.get()));
  s.eager_limit = std::min(eager_cap, eager_budget / (2 * static_cast<uint64_t>(ranks))) /
                  proxy::kSlotAlignment * proxy::kSlotAlignment;
  s.eager_bytes = std::max(
      s.eager_limit, ll ? low_latency::ll_slot_from_rdma_bytes(opts.num_rdma_bytes, ranks) : 0);
  s.data_bytes = static_cast<uint64_t>(opts.num_nvl_bytes);
  s.staging_bytes = static_cast<uint64_t>(opts.num_rdma_bytes);
  s.chunk_bytes = static_cast<uint64_t>(std::max<int64_t>(4096, params::ep_chunk_bytes.get()));
  // Hierarchical internode for normal-mode calls, host and device; low-latency calls write every
  // rank (and mask ranks): a low-latency Buffer sends per rank.
  const proxy::Internode asked = opts.internode.value_or(
      params::ep_internode.get() == "hierarchical" ? proxy::Internode::hierarchical
                                                   : proxy::Internode::per_rank);
  s.internode = ll ? proxy::Internode::per_rank : asked;
  return s;
}

}  // namespace proxyep::integrations
