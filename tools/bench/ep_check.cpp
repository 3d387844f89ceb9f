#include "tools/bench/ep_check.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

double max_over_mean(const std::vector<int64_t>& values) {
  if (values.empty()) return 0;
  double sum = std::accumulate(values.begin(), values.end(), 0.0);
  double mean = sum / static_cast<double>(values.size());
  return mean > 0 ? static_cast<double>(*std::max_element(values.begin(), values.end())) / mean : 0;
}

// (token, destination node) pairs of source rank `source`: every node (DeepEP's RDMA byte count,
// DEEPEP_CONTRACT 4.2, counts the own node too) and other nodes only (what must cross the fabric).
std::pair<int64_t, int64_t> count_node_pairs(const ep::Tensor& is_token_in_rank,
                                             const ep::EpShape& shape, int source) {
  const auto* in_rank = is_token_in_rank.data<uint8_t>();
  const int own = shape.node_of_rank(source);
  int64_t pairs = 0, other = 0;
  std::vector<uint8_t> reached(static_cast<size_t>(shape.num_nodes()));
  for (int64_t t = 0; t < is_token_in_rank.rows(); ++t) {
    std::fill(reached.begin(), reached.end(), 0);
    for (int r = 0; r < shape.num_ranks; ++r)
      if (in_rank[t * shape.num_ranks + r]) reached[shape.node_of_rank(r)] = 1;
    pairs += std::count(reached.begin(), reached.end(), 1);
    other += std::count(reached.begin(), reached.end(), 1) - reached[own];
  }
  return {pairs, other};
}

// A token row's bytes in BF16 (combine's format), and dispatch's share of that (FP8: one byte a
// channel plus a float32 scale per 128).
double bf16_row_bytes(const ep::WorkloadOptions& options) {
  return static_cast<double>(options.hidden) * 2;
}
double dispatch_factor(const ep::WorkloadOptions& options) {
  return options.fp8 ? (1.0 + 4.0 / 128.0) / 2.0 : 1.0;
}

// Adds source `source`'s figures (from its layout) to `traffic`; finish_traffic derives the rest.
void add_traffic(EpTraffic& traffic, const ep::WorkloadOptions& options, int source,
                 const ep::DispatchLayout& layout) {
  const auto& shape = options.shape;
  const auto R = static_cast<size_t>(shape.num_ranks);
  if (traffic.recv_rows.empty()) {
    traffic.recv_rows.assign(R, 0);
    traffic.tokens_per_expert.assign(static_cast<size_t>(shape.num_experts), 0);
  }
  const auto* per_rank = layout.num_tokens_per_rank.data<int32_t>();
  for (size_t r = 0; r < R; ++r)
    traffic.recv_rows[r] += per_rank[r];
  const auto* per_expert = layout.num_tokens_per_expert.data<int32_t>();
  for (int e = 0; e < shape.num_experts; ++e)
    traffic.tokens_per_expert[static_cast<size_t>(e)] += per_expert[e];
  const double row_bytes = bf16_row_bytes(options), fp8_factor = dispatch_factor(options);
  auto [pairs, other_node_pairs] = count_node_pairs(layout.is_token_in_rank, shape, source);
  traffic.node_pairs.push_back(pairs);
  traffic.rdma_dispatch_bytes.push_back(static_cast<double>(pairs) * row_bytes * fp8_factor);
  traffic.rdma_combine_bytes.push_back(static_cast<double>(pairs) * row_bytes);
  traffic.fabric_dispatch_bytes.push_back(static_cast<double>(other_node_pairs) * row_bytes *
                                          fp8_factor);
  traffic.fabric_combine_bytes.push_back(static_cast<double>(other_node_pairs) * row_bytes);
}

void finish_traffic(EpTraffic& traffic, const ep::WorkloadOptions& options) {
  const double row_bytes = bf16_row_bytes(options), fp8_factor = dispatch_factor(options);
  for (int64_t rows : traffic.recv_rows) {
    traffic.dispatch_bytes.push_back(static_cast<double>(rows) * row_bytes * fp8_factor);
    traffic.combine_bytes.push_back(static_cast<double>(rows) * row_bytes);
  }
  traffic.expert_imbalance = max_over_mean(traffic.tokens_per_expert);
  traffic.rank_imbalance = max_over_mean(traffic.recv_rows);
}

}  // namespace

ep::Tensor expert_output(const ep::Tensor& recv_x, const ep::Tensor& recv_x_scales) {
  if (recv_x.dtype() == ep::DType::bf16) return recv_x;
  require(recv_x.dtype() == ep::DType::fp8_e4m3 && recv_x_scales.defined(), "bench.ep",
          "expert output: expected bf16, or fp8 with scales");
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, recv_x.rows(), recv_x.cols());
  const auto* in = recv_x.data<uint8_t>();
  const auto* scales = recv_x_scales.data<float>();
  auto* dst = out.data<uint16_t>();
  int64_t cols = recv_x.cols(), blocks = recv_x_scales.cols();
  for (int64_t r = 0; r < recv_x.rows(); ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] = ep::float_to_bf16(ep::e4m3_to_float(in[r * cols + c]) *
                                            scales[r * blocks + c / ep::kScaleBlock]);
  return out;
}

nlohmann::json EpTraffic::to_json(int nodes) const {
  nlohmann::json j = {
      {"recv_tokens_per_rank", recv_rows},       {"dispatch_bytes_per_rank", dispatch_bytes},
      {"combine_bytes_per_rank", combine_bytes}, {"tokens_per_expert", tokens_per_expert},
      {"expert_imbalance", expert_imbalance},    {"rank_imbalance", rank_imbalance}};
  if (nodes > 1) {
    j["node_pairs_per_rank"] = node_pairs;
    j["rdma_dispatch_bytes_per_rank"] = rdma_dispatch_bytes;
    j["rdma_combine_bytes_per_rank"] = rdma_combine_bytes;
    j["fabric_dispatch_bytes_per_rank"] = fabric_dispatch_bytes;
    j["fabric_combine_bytes_per_rank"] = fabric_combine_bytes;
  }
  return j;
}

namespace {

// What `rank` needs of `source`'s inputs: all of its own; of another rank, the routing and only
// the rows of x routed to `rank` (the others stay zero), a few of each peer's at 128 ranks.
ep::RankInputs inputs_for(const ep::WorkloadOptions& options, int source, int rank) {
  if (source == rank) return ep::make_rank_inputs(options, source);
  ep::RankInputs in = ep::make_rank_routing(options, source);
  const auto* idx = in.topk_idx.data<int64_t>();
  const int64_t topk = in.topk_idx.cols();
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < in.topk_idx.rows(); ++t)
    for (int64_t k = 0; k < topk; ++k)
      if (options.shape.local_expert(idx[t * topk + k], rank) >= 0) {
        rows.push_back(t);
        break;
      }
  ep::make_x_rows(options, source, rows, in);
  return in;
}

ep::DispatchInputs dispatch_view(const ep::RankInputs& in, bool fp8) {
  return {fp8 ? in.x_fp8.ref() : in.x.ref(), fp8 ? in.x_scales.ref() : ep::TensorRef{},
          in.topk_idx.ref(), in.topk_weights.ref()};
}

}  // namespace

EpReference::EpReference(const ep::WorkloadOptions& options, int rank,
                         std::span<const ep::RankInputs> given)
    : options_(options), rank_(rank) {
  const auto& shape = options.shape;
  require(given.empty() || static_cast<int>(given.size()) == shape.num_ranks, "bench.ep",
          "reference: {} ranks' inputs for {} ranks", given.size(), shape.num_ranks);
  ep::ReferenceReceiver receiver(shape, rank);
  for (int source = 0; source < shape.num_ranks; ++source) {
    ep::RankInputs generated;
    if (given.empty()) generated = inputs_for(options, source, rank);
    const ep::RankInputs& in = given.empty() ? generated : given[static_cast<size_t>(source)];
    receiver.add_source(source, dispatch_view(in, options.fp8));
    add_traffic(traffic_, options, source, ep::compute_dispatch_layout(in.topk_idx, shape));
    if (source == rank) own_ = in;  // shares the storage (Tensor handles)
  }
  dispatched_ = receiver.finish();
  finish_traffic(traffic_, options);
}

ep::ReferenceCombine EpReference::combine(ep::CombineOrder order) const {
  // What each rank receives from this one alone: the rows that come back to it.
  const auto& shape = options_.shape;
  std::vector<ep::ReferenceDispatch> from_me;
  std::vector<ep::Tensor> outs;
  std::vector<ep::TensorRef> refs;
  for (int r = 0; r < shape.num_ranks; ++r) {
    ep::ReferenceReceiver receiver(shape, r);
    receiver.add_source(rank_, dispatch_view(own_, options_.fp8));
    from_me.push_back(receiver.finish());
    outs.push_back(expert_output(from_me.back().recv_x, from_me.back().recv_x_scales));
  }
  for (const auto& out : outs)
    refs.push_back(out.ref());
  // No combine weights: the timed combine passes none (DeepEP's timed loop does the same).
  return ep::reference_combine(refs, from_me, {}, shape, rank_, options_.tokens_of(rank_), {}, {},
                               order);
}

std::string compare_tensor(const ep::TensorRef& got, const ep::TensorRef& want,
                           std::string_view name) {
  if (!want.defined())
    return got.defined() && got.numel() != 0
               ? fmt::format("{}: unexpected {}", name, got.describe())
               : "";
  if (!got.defined() && want.numel() == 0) return "";
  if (got.dtype != want.dtype || got.rows != want.rows || got.cols != want.cols)
    return fmt::format("{}: got {}, expected {}", name, got.describe(), want.describe());
  size_t elem = ep::dtype_size(want.dtype);
  const auto* g = static_cast<const std::byte*>(got.data);
  const auto* w = static_cast<const std::byte*>(want.data);
  for (int64_t r = 0; r < want.rows; ++r) {
    // Whole rows at once where both are row-contiguous (recv_x is large).
    if (got.col_stride == 1 && want.col_stride == 1 &&
        std::memcmp(g + r * got.row_stride * elem, w + r * want.row_stride * elem,
                    want.cols * elem) == 0)
      continue;
    for (int64_t c = 0; c < want.cols; ++c) {
      const auto* a = g + (r * got.row_stride + c * got.col_stride) * elem;
      const auto* b = w + (r * want.row_stride + c * want.col_stride) * elem;
      if (std::memcmp(a, b, elem) != 0)
        return fmt::format("{}: row {} column {} differs from the reference", name, r, c);
    }
  }
  return "";
}

std::string compare_dispatch(const DispatchOutputs& got, const ep::ReferenceDispatch& want) {
  std::string diff = compare_tensor(got.recv_x, want.recv_x, "recv_x");
  if (diff.empty() && got.recv_x_scales.defined())
    diff = compare_tensor(got.recv_x_scales, want.recv_x_scales, "recv_x_scales");
  if (diff.empty() && got.recv_topk_idx.defined())
    diff = compare_tensor(got.recv_topk_idx, want.recv_topk_idx, "recv_topk_idx");
  if (diff.empty() && got.recv_topk_weights.defined())
    diff = compare_tensor(got.recv_topk_weights, want.recv_topk_weights, "recv_topk_weights");
  if (diff.empty() && got.recv_src_idx.defined())
    diff = compare_tensor(got.recv_src_idx, want.recv_src_idx, "recv_src_idx");
  if (diff.empty() && got.num_recv_tokens_per_expert &&
      *got.num_recv_tokens_per_expert != want.num_recv_tokens_per_expert)
    diff = fmt::format(
        "num_recv_tokens_per_expert: got {} entries summing to {}, expected {} "
        "summing to {}",
        got.num_recv_tokens_per_expert->size(),
        std::accumulate(got.num_recv_tokens_per_expert->begin(),
                        got.num_recv_tokens_per_expert->end(), 0L),
        want.num_recv_tokens_per_expert.size(),
        std::accumulate(want.num_recv_tokens_per_expert.begin(),
                        want.num_recv_tokens_per_expert.end(), 0L));
  return diff;
}

}  // namespace proxyep::tools
