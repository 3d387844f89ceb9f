// DeepEP V2's expanded layout on the host (expand.hpp).
#include "integrations/elastic/expand.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/host_reduce.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::elastic {

namespace {

constexpr const char* kPhase = "dispatch";

int64_t align_up(int64_t n, int a) {
  return (n + a - 1) / a * a;
}

// The slot of lane k of received row i, or -1 (metadata columns 2..).
int32_t slot_of(const int32_t* metadata, int topk, int64_t i, int k) {
  return metadata[i * (topk + 2) + 2 + k];
}

}  // namespace

ExpandPlan plan_expand(std::span<const int> counts, int alignment) {
  require(alignment >= 1, kPhase, "expert_alignment must be >= 1; got {}", alignment);
  ExpandPlan plan;
  int64_t end = 0;
  for (const int count : counts) {
    const int64_t base = align_up(end, alignment);
    end = base + count;
    plan.base.push_back(static_cast<int32_t>(base));
    plan.psum.push_back(static_cast<int32_t>(end));
  }
  plan.slots = align_up(end, alignment);
  return plan;
}

void assign_slots(const ExpandPlan& plan, const TensorRef& recv_topk_idx, int64_t num_recv,
                  int32_t* metadata) {
  const int K = static_cast<int>(recv_topk_idx.cols);
  const auto experts = static_cast<int64_t>(plan.base.size());
  std::vector<int64_t> next(plan.base.begin(), plan.base.end());
  const int64_t* idx = recv_topk_idx.as<int64_t>();
  for (int64_t i = 0; i < num_recv; ++i)
    for (int k = 0; k < K; ++k) {
      const int64_t e = idx[i * K + k];
      int32_t slot = -1;
      if (e >= 0) {
        require(e < experts && next[static_cast<size_t>(e)] < plan.psum[static_cast<size_t>(e)],
                kPhase, "received row {} names local expert {} past its {} counted pairs", i, e,
                e < experts ? plan.psum[static_cast<size_t>(e)] - plan.base[static_cast<size_t>(e)]
                            : 0);
        slot = static_cast<int32_t>(next[static_cast<size_t>(e)]++);
      }
      metadata[i * (K + 2) + 2 + k] = slot;
    }
  for (int64_t e = 0; e < experts; ++e)
    require(next[static_cast<size_t>(e)] == plan.psum[static_cast<size_t>(e)], kPhase,
            "the received rows name {} pairs of local expert {}, the notify phase counted {}",
            next[static_cast<size_t>(e)] - plan.base[static_cast<size_t>(e)], e,
            plan.psum[static_cast<size_t>(e)] - plan.base[static_cast<size_t>(e)]);
}

void expand_rows(const std::byte* from, std::byte* to, uint64_t unit, bool per_lane,
                 const int32_t* metadata, int64_t num_recv, int topk, int64_t slots,
                 bool zero_gaps) {
  if (zero_gaps) std::memset(to, 0, static_cast<size_t>(slots) * unit);
  for (int64_t i = 0; i < num_recv; ++i)
    for (int k = 0; k < topk; ++k) {
      const int32_t slot = slot_of(metadata, topk, i, k);
      if (slot < 0) continue;
      const std::byte* row = from + (per_lane ? (i * topk + k) * unit : i * unit);
      std::memcpy(to + static_cast<uint64_t>(slot) * unit, row, unit);
    }
}

Folded fold_expanded(const TensorRef& x_expanded, const TensorRef& weights,
                     const TensorRef& metadata, int64_t num_recv) {
  const int K = static_cast<int>(metadata.cols) - 2;
  const int64_t hidden = x_expanded.cols;
  Folded out{Tensor::empty(ep::DType::bf16, num_recv, hidden), {}};
  // The reduce of combine with the K lanes as its "ranks": every lane's block is x_expanded,
  // token i's row in lane k's block is its slot. Lanes ascending: DeepEP's order of the slots.
  std::vector<int32_t> heads(static_cast<size_t>(num_recv * K));
  for (int64_t i = 0; i < num_recv; ++i)
    for (int k = 0; k < K; ++k)
      heads[static_cast<size_t>(i * K + k)] = slot_of(metadata.as<int32_t>(), K, i, k);
  const auto* rows = static_cast<const uint16_t*>(x_expanded.data);
  const std::vector<const uint16_t*> blocks(static_cast<size_t>(K), rows);
  ep::reduce_tokens_host({.block_rows = blocks.data(),
                          .send_head = heads.data(),
                          .out = out.x.data<uint16_t>(),
                          .num_ranks = K,
                          .hidden = hidden},
                         0, num_recv);
  if (!weights.defined()) return out;
  out.weights = Tensor::empty(ep::DType::f32, num_recv, K);
  const float* w = weights.as<float>();
  float* lanes = out.weights.data<float>();
  for (int64_t i = 0; i < num_recv * K; ++i)
    lanes[i] = heads[static_cast<size_t>(i)] >= 0 ? w[heads[static_cast<size_t>(i)]] : 0.0f;
  return out;
}

}  // namespace proxyep::integrations::elastic
