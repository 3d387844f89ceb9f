// A hierarchical internode combine's streams and reduce (hier_combine_rows.hpp).
#include "integrations/normal/hier_combine_rows.hpp"

#include "common/error.hpp"
#include "integrations/normal/chunk_plan.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "combine";

}  // namespace

HierCombineStreams::HierCombineStreams(RowBackend& backend, const ep::RowFormat& format,
                                       const RowCounts& counts, const DispatchHandle& handle,
                                       const std::byte* x, const float* weights, int topk,
                                       const proxy::Session& session, bool x_on_device,
                                       bool v2_order)
    : CombineStreams(backend, format, counts, x, weights, topk, session.rank(), x_on_device),
      layout_(session.layout()),
      handle_(handle),
      hidden_(format.hidden_bytes / 2),
      taken_rows_(static_cast<size_t>(session.ranks()), 0),
      heads_(static_cast<size_t>(session.ranks()), nullptr),
      orders_(static_cast<size_t>(session.ranks()), nullptr),
      need_(static_cast<size_t>(session.ranks())) {
  const int R = session.ranks(), rpn = layout_.sizes().ranks_per_node;
  const int nodes = layout_.nodes(), own = layout_.node();
  const uint64_t eager = layout_.sizes().eager_limit;
  // Each token's place in each node's partials (the reduce's heads): the own node's partial is
  // indexed by token, another node's by the token's row in the dispatch's fabric stream there,
  // so counting those rows also gives that stream's size (this rank's rows to the node).
  const int64_t tokens = handle.num_tokens;
  const bool* in_rank = handle.is_token_in_rank.data<bool>();
  const int32_t* send_head = handle.send_head.data<int32_t>();
  own_head_ = ep::Tensor::empty(DType::i32, tokens, rpn);
  node_head_ = ep::Tensor::empty(DType::i32, tokens, nodes);
  std::vector<int32_t> to_node(static_cast<size_t>(nodes), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < rpn; ++k)
      own_head_.data<int32_t>()[t * rpn + k] = send_head[t * R + own * rpn + k];
    for (int n = 0; n < nodes; ++n) {
      bool hit = false;
      for (int k = 0; k < rpn && !hit; ++k)
        hit = in_rank[t * R + n * rpn + k];
      node_head_.data<int32_t>()[t * nodes + n] = !hit       ? -1
                                                  : n == own ? static_cast<int32_t>(t)
                                                             : to_node[static_cast<size_t>(n)]++;
    }
  }
  require(handle.forward_heads.size() == static_cast<size_t>(layout_.nodes() - 1), kPhase,
          "the handle holds no forwarding of a hierarchical dispatch (made by another Buffer, or "
          "a cached dispatch's)");
  if (v2_order) {
    require(handle.own_node_order.defined() &&
                handle.forward_orders.size() == handle.forward_heads.size(),
            kPhase,
            "DeepEP V2's order inside nodes needs a fresh dispatch's handle with topk_idx (its "
            "in-node orders)");
    require(handle.own_node_order.rows() == tokens && handle.own_node_order.cols() == rpn, kPhase,
            "the handle's own_node_order is {} x {}; expected {} x {}",
            handle.own_node_order.rows(), handle.own_node_order.cols(), tokens, rpn);
    own_order_ = handle.own_node_order.data<int32_t>();
  }
  size_t forwarded = 0;
  for (int r = 0; r < R; ++r) {
    if (r == me_) continue;
    const proxy::SlotGeometry slots = session.channel(r).slots();
    if (layout_.on_node(r)) {
      out[r] = plan_stream(static_cast<uint64_t>(counts.at(r, me_)), format, slots, eager);
      in[r] = plan_stream(static_cast<uint64_t>(counts.at(me_, r)), format, slots, eager);
    } else if (counterpart(r)) {
      const ep::Tensor& heads = handle.forward_heads[forwarded];
      require(heads.dims() == 2 && heads.cols() == rpn, kPhase,
              "the handle's forwarding for rank {} is {} rows of {} heads; the node has {} ranks",
              r, heads.rows(), heads.cols(), rpn);
      heads_[r] = &heads;
      if (v2_order) {
        const ep::Tensor& order = handle.forward_orders[forwarded];
        require(order.rows() == heads.rows() && order.cols() == rpn, kPhase,
                "the handle's in-node order for rank {} is {} x {}; expected {} x {}", r,
                order.rows(), order.cols(), heads.rows(), rpn);
        orders_[r] = order.data<int32_t>();
      }
      ++forwarded;
      out[r] = plan_stream(static_cast<uint64_t>(heads.rows()), format, slots, 0);
      in[r] = plan_stream(static_cast<uint64_t>(to_node[static_cast<size_t>(node_of(r))]), format,
                          slots, 0);
      auto& need = need_[static_cast<size_t>(r)];
      need.assign(static_cast<size_t>(rpn),
                  std::vector<uint64_t>(static_cast<size_t>(heads.rows()) + 1, 0));
      const int32_t* h = heads.data<int32_t>();
      for (int k = 0; k < rpn; ++k)
        for (int64_t i = 0; i < heads.rows(); ++i)
          need[k][i + 1] =
              h[i * rpn + k] >= 0 ? static_cast<uint64_t>(h[i * rpn + k]) + 1 : need[k][i];
    } else {
      // Lane x: out, x's own rows back towards it; in, the rows the reached peer returns for
      // this rank's counterpart on x's node.
      const int source = layout_.counterpart(node_of(r)), peer = layout_.forwarder_of(r);
      out[r] = plan_stream(static_cast<uint64_t>(counts.at(r, me_)), format, slots, 0);
      in[r] = plan_stream(static_cast<uint64_t>(counts.at(source, peer)), format, slots, 0);
    }
  }
}

bool HierCombineStreams::rows_ready(int c, uint64_t end) const {
  if (!counterpart(c)) return true;
  const int rpn = layout_.sizes().ranks_per_node;
  const auto& need = need_[static_cast<size_t>(c)];
  for (int k = 0; k < rpn; ++k) {
    const int lane = node_of(c) * rpn + k;
    if (k == me_ % rpn) continue;  // this rank's own rows are in x
    if (taken_rows_[static_cast<size_t>(lane)] < need[k][end]) return false;
  }
  return true;
}

HierCombineStreams::NodeBlocks HierCombineStreams::forwarded_blocks(int c) const {
  const int rpn = layout_.sizes().ranks_per_node;
  NodeBlocks b;
  for (int k = 0; k < rpn; ++k) {
    if (k == me_ % rpn) {
      // This rank's own rows for c: x's rows [first_from(c, me), ...).
      const int64_t first = counts_.first_from(c, me_);
      b.rows.push_back(reinterpret_cast<const uint16_t*>(x_ + first * row_bytes_));
      b.weights.push_back(weights_ != nullptr ? weights_ + first * topk_ : nullptr);
      b.chunks.push_back(nullptr);
      b.chunk_rows.push_back(0);
      continue;
    }
    const auto lane = static_cast<size_t>(node_of(c) * rpn + k);
    b.rows.push_back(block_rows_[lane]);
    b.weights.push_back(block_weights_[lane]);
    b.chunks.push_back(block_chunks_[lane]);
    b.chunk_rows.push_back(block_chunk_rows_[lane]);
  }
  return b;
}

void HierCombineStreams::reduce_blocks(const NodeBlocks& b, const int32_t* head, int64_t tokens,
                                       uint16_t* out, float* out_weights, ep::CombineInput input) {
  input.block_rows = b.rows.data();
  input.block_weights = topk_ > 0 ? b.weights.data() : nullptr;
  input.block_chunks = b.chunks.data();
  input.block_chunk_rows = b.chunk_rows.data();
  input.send_head = head;
  input.out = out;
  input.out_weights = topk_ > 0 ? out_weights : nullptr;
  input.num_ranks = static_cast<int>(b.rows.size());
  input.hidden = hidden_;
  input.topk = topk_;
  backend.reduce(input, tokens);
}

void HierCombineStreams::fill(int d, uint64_t first, uint64_t rows, std::byte* slot) {
  if (!counterpart(d)) return CombineStreams::fill(d, first, rows, slot);
  // The node's partial rows [first, first + rows) for d's tokens, straight into the slot.
  const int rpn = layout_.sizes().ranks_per_node;
  const auto areas = ep::RowAreas::of(rows, format);
  ep::CombineInput input;
  if (const int32_t* order = orders_[static_cast<size_t>(d)]; order != nullptr)
    input.order = order + first * rpn;
  reduce_blocks(forwarded_blocks(d), heads_[static_cast<size_t>(d)]->data<int32_t>() + first * rpn,
                static_cast<int64_t>(rows), reinterpret_cast<uint16_t*>(slot + areas.x),
                reinterpret_cast<float*>(slot + areas.weights), input);
}

void HierCombineStreams::take(int s, uint64_t chunk, uint64_t first, uint64_t rows,
                              const std::byte* slot) {
  CombineStreams::take(s, chunk, first, rows, slot);
  taken_rows_[static_cast<size_t>(s)] = first + rows;
}

const std::byte* HierCombineStreams::caller_rows(int d, uint64_t first, uint64_t rows) const {
  // A counterpart's rows are partial sums, not x's.
  return counterpart(d) ? nullptr : CombineStreams::caller_rows(d, first, rows);
}

void HierCombineStreams::reduce(const ep::Tensor& combined_x, const ep::Tensor& combined_weights,
                                ep::CombineInput last_step) {
  const int rpn = layout_.sizes().ranks_per_node;
  const int nodes = layout_.nodes(), own = layout_.node();
  const int64_t tokens = handle_.num_tokens;
  // 1. This node's partial, as a forwarder's: its ranks ascending (V2: by last lane), rounded to
  // bf16.
  own_x_ = backend.allocate(DType::bf16, tokens, hidden_);
  if (topk_ > 0) own_weights_ = backend.allocate(DType::f32, tokens, topk_);
  ep::Tensor& own_x = own_x_;
  ep::Tensor& own_weights = own_weights_;
  const size_t first = static_cast<size_t>(own) * static_cast<size_t>(rpn);
  NodeBlocks own_node;
  own_node.rows.assign(block_rows_.begin() + first, block_rows_.begin() + first + rpn);
  own_node.weights.assign(block_weights_.begin() + first, block_weights_.begin() + first + rpn);
  own_node.chunks.assign(block_chunks_.begin() + first, block_chunks_.begin() + first + rpn);
  own_node.chunk_rows.assign(block_chunk_rows_.begin() + first,
                             block_chunk_rows_.begin() + first + rpn);
  ep::CombineInput own_input;
  own_input.order = own_order_;
  reduce_blocks(own_node, own_head_.data<int32_t>(), tokens, own_x.data<uint16_t>(),
                topk_ > 0 ? own_weights.data<float>() : nullptr, own_input);
  // 2. The nodes' partials, after the biases: ascending, or in last_step.order.
  last_step.bias_first = true;
  NodeBlocks b;
  for (int n = 0; n < nodes; ++n) {
    const auto c = static_cast<size_t>(layout_.counterpart(n));
    const bool mine = n == own;
    b.rows.push_back(mine ? own_x.data<uint16_t>() : block_rows_[c]);
    b.weights.push_back(mine ? (topk_ > 0 ? own_weights.data<float>() : nullptr)
                             : block_weights_[c]);
    b.chunks.push_back(mine ? nullptr : block_chunks_[c]);
    b.chunk_rows.push_back(mine ? 0 : block_chunk_rows_[c]);
  }
  reduce_blocks(
      b, node_head_.data<int32_t>(), tokens, const_cast<uint16_t*>(combined_x.data<uint16_t>()),
      topk_ > 0 ? const_cast<float*>(combined_weights.data<float>()) : nullptr, last_step);
}

}  // namespace proxyep::integrations::normal
