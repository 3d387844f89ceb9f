// The rows of a hierarchical internode combine (proxy/session/arena_layout.hpp), the dispatch's
// path backwards, reduced inside each node before the fabric:
//   node peer q        out: x's rows from q, to q; in: q's rows for this rank's tokens (as
//                      per_rank);
//   relay lane x       out: x's rows from rank x (another node's), to x's forwarder here; in:
//                      the rows the node peer the lane reaches returns for this rank's
//                      counterpart on x's node, which this rank reduces;
//   counterpart c      out: one row per token of c this rank forwarded at dispatch, the float32
//                      sum over this node's ranks (ascending) of their rows for it, rounded to
//                      bf16 (weights summed, not rounded), filled once every lane row it needs
//                      arrived (rows_ready); in: c's node's partial row for each of this rank's
//                      tokens that went there.
// reduce() then sums this rank's own node the same way and adds the nodes' partial rows,
// nodes ascending, after the biases: the order gpu_side/ep/reference.hpp calls by_node, as
// DeepEP's internode combine. Device calls: the rows, partials and sums are in the device's
// memory and reduced by its kernel; the host reads only the handle's routing (host memory).
#pragma once

#include "integrations/normal/combine_rows.hpp"
#include "proxy/session/session.hpp"

#include <vector>

namespace proxyep::integrations::normal {

class HierCombineStreams final : public CombineStreams {
 public:
  // `x_on_device`: as CombineStreams'. `v2_order`: DeepEP V2's combine (CombineArgs::order
  // given): each node partial adds its ranks' rows by their last lane (the handle's
  // own_node_order and forward_orders), not in rank order.
  HierCombineStreams(RowBackend& backend, const gpu_side::ep::RowFormat& format,
                     const RowCounts& counts, const DispatchHandle& handle, const std::byte* x,
                     const float* weights, int topk, const proxy::Session& session,
                     bool x_on_device, bool v2_order);

  bool rows_ready(int destination, uint64_t end) const override;
  void fill(int destination, uint64_t first, uint64_t rows, std::byte* slot) override;
  void take(int source, uint64_t chunk, uint64_t first, uint64_t rows,
            const std::byte* slot) override;
  const std::byte* caller_rows(int destination, uint64_t first, uint64_t rows) const override;

  // This rank's tokens, once every stream is done: combined_x (bf16 [num_tokens, hidden]) and
  // combined weights (f32 [num_tokens, topk], with topk > 0). `last_step`: the biases and, for
  // DeepEP V2, the order and weight owners over nodes of the reduce of the nodes' partials
  // (which always puts the biases first); its other fields are set here.
  void reduce(const gpu_side::ep::Tensor& combined_x, const gpu_side::ep::Tensor& combined_weights,
              gpu_side::ep::CombineInput last_step);

 private:
  bool counterpart(int r) const { return layout_.fabric_peer(r); }
  int node_of(int r) const { return r / layout_.sizes().ranks_per_node; }
  // The blocks a forwarder's partial for counterpart c sums: this node's ranks, in rank order.
  struct NodeBlocks {
    std::vector<const uint16_t*> rows;
    std::vector<const float*> weights;
    std::vector<const uint16_t* const*> chunks;
    std::vector<int64_t> chunk_rows;
  };
  NodeBlocks forwarded_blocks(int c) const;
  // backend.reduce of `tokens` tokens over `blocks` (one per rank of a node, or per node) by
  // `head` ([tokens, blocks]) into `out` / `out_weights`; `input` adds the biases, if any.
  void reduce_blocks(const NodeBlocks& blocks, const int32_t* head, int64_t tokens, uint16_t* out,
                     float* out_weights, gpu_side::ep::CombineInput input = {});

  const proxy::ArenaLayout& layout_;
  const DispatchHandle& handle_;
  int64_t hidden_;
  std::vector<uint64_t> taken_rows_;  // by channel: rows taken so far
  // By counterpart: the forwarded rows' heads (the handle's), and for each rank k of this node
  // need[k][i] = the rows of k's lane that rows [0, i) need (1 + their largest head there).
  std::vector<const gpu_side::ep::Tensor*> heads_;
  // By counterpart, with v2_order: the forwarded rows' order of this node's ranks (the
  // handle's); null otherwise.
  std::vector<const int32_t*> orders_;
  const int32_t* own_order_ = nullptr;  // the handle's own_node_order, with v2_order
  std::vector<std::vector<std::vector<uint64_t>>> need_;
  // The final reduce's heads: i32 [tokens, ranks_per_node] (this node's ranks' rows) and
  // [tokens, nodes] (each node's partial row of the token, or -1).
  gpu_side::ep::Tensor own_head_, node_head_;
  // This node's partial sums (reduce()): members, since a device's stream reads them after
  // reduce() returns.
  gpu_side::ep::Tensor own_x_, own_weights_;
};

}  // namespace proxyep::integrations::normal
