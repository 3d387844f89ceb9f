// DeepEP V2's dispatch as one call (elastic_dispatch.hpp).
#include "integrations/elastic/elastic_dispatch.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/combine_order.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/elastic/elastic_fields.hpp"
#include "integrations/elastic/host_views.hpp"
#include "integrations/normal/row_counts.hpp"

#include <algorithm>
#include <span>
#include <string_view>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::elastic {

namespace {

constexpr const char* kPhase = "dispatch";

// Rows this rank received from each source rank (the handle's rank prefix matrix).
std::vector<int64_t> received_from_each(const DispatchHandle& h, int me) {
  return normal::RowCounts::from_handle(h).received_from_each(me);
}

Tensor host_i32(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(ep::DType::i32, static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

bool on_host(const TensorRef& t) {
  return t.defined() && t.device == ep::Device::host;
}

// DeepEP's worst case of the expanded layout without CPU sync: every rank's every token in
// min(K, E_local) local slots, plus each expert's alignment gap.
int64_t worst_case_slots(int ranks, int64_t tokens_per_rank, int topk, int local_experts,
                         int alignment) {
  const int64_t slots = ranks * tokens_per_rank * std::min(topk, local_experts) +
                        int64_t{alignment - 1} * local_experts;
  return (slots + alignment - 1) / alignment * alignment;
}

// The received rows (v1's outputs) copied into `slots` expanded slots by the metadata (a host
// view), in the memory the rows are in, by `rows` (their backend); complete at return.
ExpandedRows expand_outputs(RowBackend& rows, const DispatchResult& v1, const TensorRef& metadata,
                            int64_t num_recv, int64_t slots, bool zero_gaps) {
  const int K = static_cast<int>(metadata.cols) - 2;
  const int32_t* m = metadata.as<int32_t>();
  auto expand = [&](const Tensor& from, Tensor to, bool per_lane) {
    const uint64_t unit = to.bytes() / static_cast<uint64_t>(std::max<int64_t>(slots, 1));
    if (zero_gaps) rows.fill(to.raw(), 0, to.bytes());
    rows.copy_runs(expand_runs(from.raw(), to.raw(), unit, per_lane, m, num_recv, K));
    return to;
  };
  ExpandedRows out;
  out.slots = slots;
  const Tensor& x = v1.recv_x;
  out.x = expand(x, rows.allocate(x.dtype(), slots, x.cols()), false);
  if (v1.recv_x_scales.defined())
    out.scales =
        expand(v1.recv_x_scales,
               rows.allocate(v1.recv_x_scales.dtype(), slots, v1.recv_x_scales.cols()), false);
  if (v1.recv_topk_weights.defined())
    out.weights = expand(v1.recv_topk_weights, rows.allocate(ep::DType::f32, slots), true);
  rows.complete(kPhase);
  return out;
}

// recv_src_metadata from host views of the handle's recv_src_idx and of recv_topk_idx; `from`:
// the rows received from each source rank.
Tensor source_metadata_of(const Buffer& buffer, std::span<const int64_t> from,
                          const TensorRef& recv_src_idx, const TensorRef& recv_topk_idx,
                          int num_experts, int64_t num_max_tokens_per_rank) {
  const Routing routing{.ranks = buffer.group_size(),
                        .local_experts = num_experts / buffer.group_size(),
                        .topk = static_cast<int>(recv_topk_idx.cols)};
  const int64_t rows = recv_topk_idx.rows;
  Tensor meta = Tensor::empty(ep::DType::i32, rows, routing.topk + 2);
  source_metadata(routing, from, recv_src_idx.as<int32_t>(), recv_topk_idx.as<int64_t>(),
                  num_max_tokens_per_rank, rows, meta.data<int32_t>());
  return meta;
}

}  // namespace

Folded fold_expanded_rows(Buffer& buffer, const TensorRef& x, const TensorRef& weights,
                          const TensorRef& metadata, int64_t num_recv) {
  constexpr const char* phase = "combine";
  require(x.defined() && x.dtype == ep::DType::bf16 && x.dims == 2 && x.contiguous(), phase,
          "an expanded combine's x must be bf16 [slots, hidden]; got {}", x);
  const bool on_device = !on_host(x);
  if (weights.defined())
    require(weights.device == x.device && weights.dtype == ep::DType::f32 && weights.dims == 1 &&
                weights.rows >= x.rows,
            phase,
            "an expanded combine's topk_weights must be f32 [{}] (one per slot), where x is; got "
            "{}",
            x.rows, weights);
  HostViews host(buffer, phase);
  const TensorRef meta = host(metadata);
  host.wait();
  check_slot_columns(meta, num_recv, x.rows, phase);
  return fold_expanded(buffer.row_backend(on_device, phase), x, weights, meta, num_recv);
}

Tensor source_metadata(Buffer& buffer, const DispatchHandle& handle, const TensorRef& recv_topk_idx,
                       int num_experts, int64_t num_max_tokens_per_rank) {
  require(recv_topk_idx.dims == 2 && recv_topk_idx.contiguous() &&
              recv_topk_idx.dtype == ep::DType::i64 && handle.recv_src_idx.defined() &&
              recv_topk_idx.rows >= handle.num_recv_tokens,
          kPhase,
          "recv_src_metadata is computed here from a fresh dispatch's handle and its "
          "recv_topk_idx (i64 [rows, K]); got {}",
          recv_topk_idx);
  HostViews host(buffer, kPhase);
  const TensorRef src = host(handle.recv_src_idx), idx = host(recv_topk_idx);
  host.wait();
  return source_metadata_of(buffer, received_from_each(handle, buffer.rank()), src, idx,
                            num_experts, num_max_tokens_per_rank);
}

ElasticDispatchResult elastic_dispatch(Buffer& buffer, ElasticDispatchArgs args) {
  ElasticDispatchResult r;
  DispatchArgs& a = args.v1;
  const bool cached = a.handle != nullptr;
  require(a.x.defined(), kPhase, "a dispatch needs x");
  const bool on_device = !on_host(a.x);
  // Host views of the inputs the fields are computed from, taken before the call.
  HostViews inputs(buffer, kPhase);
  TensorRef topk_idx = a.topk_idx, cached_metadata = args.cached_metadata;
  if (!cached) {
    require(a.topk_idx.defined(), kPhase, "a dispatch without a handle needs topk_idx");
    require(!a.num_tokens_per_rank.defined() && !a.is_token_in_rank.defined() &&
                !a.num_tokens_per_expert.defined() && !a.num_tokens_per_rdma_rank.defined(),
            kPhase, "the layout is computed from topk_idx here: pass none");
    require(args.num_max_tokens_per_rank > 0 && a.topk_idx.rows <= args.num_max_tokens_per_rank,
            kPhase, "topk_idx has {} tokens, more than num_max_tokens_per_rank={}", a.topk_idx.rows,
            args.num_max_tokens_per_rank);
    if (!on_host(a.topk_idx)) {
      inputs.order_after(a.previous_event);
      topk_idx = inputs(a.topk_idx);
    }
    r.layout = buffer.get_dispatch_layout(a.topk_idx, args.num_experts, a.previous_event);
    a.num_tokens_per_rank = r.layout.num_tokens_per_rank;
    a.num_tokens_per_rdma_rank = r.layout.num_tokens_per_rdma_rank;
    a.is_token_in_rank = r.layout.is_token_in_rank;
    a.num_tokens_per_expert = r.layout.num_tokens_per_expert;
  }
  if (args.expand && cached) cached_metadata = inputs(args.cached_metadata);
  inputs.wait();
  if (args.expand && cached)
    check_slot_columns(cached_metadata, a.handle->num_recv_tokens, args.cached_slots, kPhase);
  r.v1 = buffer.dispatch(a);
  // The rows are copied into their slots below: they must be in first.
  if (args.expand && r.v1.event.defined()) r.v1.event.wait();
  if (cached) {
    if (args.expand)
      r.expanded = expand_outputs(buffer.row_backend(on_device, kPhase), r.v1, cached_metadata,
                                  a.handle->num_recv_tokens, args.cached_slots, args.zero_padding);
    return r;
  }

  const DispatchHandle& h = r.v1.handle;
  ElasticFields& f = r.fields;
  f.unaligned_per_expert = host_i32(std::vector<int32_t>(
      r.v1.unaligned_recv_tokens_per_expert.begin(), r.v1.unaligned_recv_tokens_per_expert.end()));
  f.psum_per_expert =
      host_i32(aligned_psum(r.v1.unaligned_recv_tokens_per_expert, a.expert_alignment));
  const std::vector<int64_t> from = received_from_each(h, buffer.rank());
  f.psum_per_scaleup_rank = host_i32(psum_per_scaleup_rank(from, args.num_scaleup_ranks));
  const Routing routing{.ranks = buffer.group_size(),
                        .local_experts = args.num_experts / buffer.group_size(),
                        .topk = static_cast<int>(topk_idx.cols)};
  f.dst_buffer_slot_idx = Tensor::empty(ep::DType::i32, topk_idx.rows, topk_idx.cols);
  send_slots(routing, topk_idx.as<int64_t>(), h.send_head.data<int32_t>(), topk_idx.rows,
             f.dst_buffer_slot_idx.data<int32_t>());
  const gpu_side::ep::EpShape shape{buffer.group_size(), buffer.ranks_per_node(), args.num_experts};
  auto tables = ep::compute_combine_order(
      topk_idx, shape,
      buffer.hierarchical_internode() ? ep::CombineGroups::node : ep::CombineGroups::rank);
  f.combine_order = std::move(tables.order);
  f.weight_owner = std::move(tables.weight_owner);
  // The received rows' fields: now if the rows are in (an async call's are computed later,
  // source_metadata()), from host views of them.
  HostViews received(buffer, kPhase);
  TensorRef recv_topk_idx = r.v1.recv_topk_idx;
  if (!a.async_finish || args.expand) {
    const TensorRef src = received(h.recv_src_idx);
    recv_topk_idx = received(r.v1.recv_topk_idx);
    received.wait();
    f.recv_src_metadata = source_metadata_of(buffer, from, src, recv_topk_idx, args.num_experts,
                                             args.num_max_tokens_per_rank);
  }
  if (args.expand) {
    const ExpandPlan plan = plan_expand(r.v1.unaligned_recv_tokens_per_expert, a.expert_alignment);
    f.psum_per_expert = host_i32(plan.psum);
    assign_slots(plan, recv_topk_idx, h.num_recv_tokens, f.recv_src_metadata.data<int32_t>());
    const int64_t slots =
        a.num_worst_tokens > 0
            ? worst_case_slots(buffer.group_size(), args.num_max_tokens_per_rank,
                               static_cast<int>(topk_idx.cols),
                               args.num_experts / buffer.group_size(), a.expert_alignment)
            : plan.slots;
    r.expanded = expand_outputs(buffer.row_backend(on_device, kPhase), r.v1, f.recv_src_metadata,
                                h.num_recv_tokens, slots, args.zero_padding);
  }
  return r;
}

}  // namespace proxyep::integrations::elastic
