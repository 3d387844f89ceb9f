// DeepEP V2's expanded layout on the host (expand.hpp).
#include "integrations/elastic/expand.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <vector>

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

void check_slot_columns(const TensorRef& metadata, int64_t num_recv, int64_t slots,
                        std::string_view phase) {
  require(metadata.defined() && metadata.device == ep::Device::host &&
              metadata.dtype == ep::DType::i32 && metadata.dims == 2 && metadata.contiguous() &&
              metadata.cols >= 2 && metadata.rows >= num_recv,
          phase, "recv_src_metadata must be int32 [>= {}, K + 2]; got {}", num_recv, metadata);
  const int32_t* m = metadata.as<int32_t>();
  for (int64_t i = 0; i < num_recv; ++i)
    for (int64_t c = 2; c < metadata.cols; ++c)
      require(m[i * metadata.cols + c] >= -1 && m[i * metadata.cols + c] < slots, phase,
              "recv_src_metadata[{}, {}] is {}: a slot in [-1, {})", i, c, m[i * metadata.cols + c],
              slots);
}

std::vector<ep::CopyRun> expand_runs(const std::byte* from, std::byte* to, uint64_t unit,
                                     bool per_lane, const int32_t* metadata, int64_t num_recv,
                                     int topk) {
  std::vector<ep::CopyRun> runs;
  runs.reserve(static_cast<size_t>(num_recv * topk));
  for (int64_t i = 0; i < num_recv; ++i)
    for (int k = 0; k < topk; ++k) {
      const int32_t slot = slot_of(metadata, topk, i, k);
      if (slot < 0) continue;
      const uint64_t row =
          per_lane ? static_cast<uint64_t>(i * topk + k) : static_cast<uint64_t>(i);
      runs.push_back({.to = to + static_cast<uint64_t>(slot) * unit,
                      .from = from + row * unit,
                      .bytes = unit});
    }
  return runs;
}

Folded sum_lanes(RowBackend& rows, const uint16_t* rows_base, const float* weights_base,
                 std::span<const int32_t> heads, int64_t tokens, int topk, int64_t hidden,
                 const uint16_t* bias0, const uint16_t* bias1) {
  Folded out{rows.allocate(ep::DType::bf16, tokens, hidden), {}};
  const std::vector<const uint16_t*> blocks(static_cast<size_t>(topk), rows_base);
  rows.reduce({.block_rows = blocks.data(),
               .send_head = heads.data(),
               .bias0 = bias0,
               .bias1 = bias1,
               .bias_first = true,  // V2's: the biases start the sum
               .out = out.x.data<uint16_t>(),
               .num_ranks = topk,
               .hidden = hidden},
              tokens);
  if (weights_base == nullptr) return out;
  out.weights = rows.allocate(ep::DType::f32, tokens, topk);
  rows.fill(out.weights.raw(), 0, out.weights.bytes());
  std::vector<ep::CopyRun> runs;
  const auto* w = reinterpret_cast<const std::byte*>(weights_base);
  for (size_t i = 0; i < heads.size(); ++i)
    if (heads[i] >= 0)
      runs.push_back({.to = out.weights.raw() + i * sizeof(float),
                      .from = w + static_cast<uint64_t>(heads[i]) * sizeof(float),
                      .bytes = sizeof(float)});
  rows.copy_runs(runs);
  return out;
}

Folded fold_expanded(RowBackend& rows, const TensorRef& x_expanded, const TensorRef& weights,
                     const TensorRef& metadata, int64_t num_recv) {
  const int K = static_cast<int>(metadata.cols) - 2;
  // Token i's row in lane k is its slot. Lanes ascending: DeepEP's order of the slots.
  std::vector<int32_t> heads(static_cast<size_t>(num_recv * K));
  for (int64_t i = 0; i < num_recv; ++i)
    for (int k = 0; k < K; ++k)
      heads[static_cast<size_t>(i * K + k)] = slot_of(metadata.as<int32_t>(), K, i, k);
  return sum_lanes(rows, x_expanded.as<uint16_t>(),
                   weights.defined() ? weights.as<float>() : nullptr, heads, num_recv, K,
                   x_expanded.cols);
}

}  // namespace proxyep::integrations::elastic
