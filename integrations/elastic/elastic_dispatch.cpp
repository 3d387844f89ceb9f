// DeepEP V2's dispatch as one call (elastic_dispatch.hpp).
#include "integrations/elastic/elastic_dispatch.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/combine_order.hpp"
#include "integrations/elastic/elastic_fields.hpp"

#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::elastic {

namespace {

constexpr const char* kPhase = "dispatch";

// Rows this rank received from each source rank: column `me` of the inclusive prefix matrix.
std::vector<int64_t> received_from_each(const DispatchHandle& h, int me) {
  const auto R = static_cast<int>(h.rank_prefix_matrix.rows());
  const auto* prefix = h.rank_prefix_matrix.data<int32_t>();
  std::vector<int64_t> from(static_cast<size_t>(R));
  for (int s = 0; s < R; ++s)
    from[static_cast<size_t>(s)] = prefix[s * R + me] - (s > 0 ? prefix[(s - 1) * R + me] : 0);
  return from;
}

Tensor host_i32(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(ep::DType::i32, static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

bool on_host(const TensorRef& t) {
  return t.defined() && t.device == ep::Device::host;
}

}  // namespace

Tensor source_metadata(const Buffer& buffer, const DispatchHandle& handle,
                       const TensorRef& recv_topk_idx, int num_experts,
                       int64_t num_max_tokens_per_rank) {
  require(on_host(recv_topk_idx) && recv_topk_idx.dims == 2 && recv_topk_idx.contiguous() &&
              recv_topk_idx.dtype == ep::DType::i64 && handle.recv_src_idx.defined() &&
              handle.recv_src_idx.device() == ep::Device::host &&
              recv_topk_idx.rows >= handle.num_recv_tokens,
          kPhase,
          "recv_src_metadata is computed here from a fresh dispatch's handle and its "
          "recv_topk_idx (host, i64 [rows, K]); got {}",
          recv_topk_idx);
  const Routing routing{.ranks = buffer.group_size(),
                        .local_experts = num_experts / buffer.group_size(),
                        .topk = static_cast<int>(recv_topk_idx.cols)};
  const int64_t rows = recv_topk_idx.rows;
  Tensor meta = Tensor::empty(ep::DType::i32, rows, routing.topk + 2);
  source_metadata(routing, received_from_each(handle, buffer.rank()),
                  handle.recv_src_idx.data<int32_t>(), recv_topk_idx.as<int64_t>(),
                  num_max_tokens_per_rank, rows, meta.data<int32_t>());
  return meta;
}

ElasticDispatchResult elastic_dispatch(Buffer& buffer, ElasticDispatchArgs args) {
  ElasticDispatchResult r;
  DispatchArgs& a = args.v1;
  const bool cached = a.handle != nullptr;
  if (!cached) {
    require(a.topk_idx.defined(), kPhase, "a dispatch without a handle needs topk_idx");
    require(!a.num_tokens_per_rank.defined() && !a.is_token_in_rank.defined() &&
                !a.num_tokens_per_expert.defined() && !a.num_tokens_per_rdma_rank.defined(),
            kPhase, "the layout is computed from topk_idx here: pass none");
    require(args.num_max_tokens_per_rank > 0 && a.topk_idx.rows <= args.num_max_tokens_per_rank,
            kPhase, "topk_idx has {} tokens, more than num_max_tokens_per_rank={}", a.topk_idx.rows,
            args.num_max_tokens_per_rank);
    r.layout = buffer.get_dispatch_layout(a.topk_idx, args.num_experts, a.previous_event);
    a.num_tokens_per_rank = r.layout.num_tokens_per_rank;
    a.num_tokens_per_rdma_rank = r.layout.num_tokens_per_rdma_rank;
    a.is_token_in_rank = r.layout.is_token_in_rank;
    a.num_tokens_per_expert = r.layout.num_tokens_per_expert;
  }
  r.v1 = buffer.dispatch(a);
  if (cached) return r;

  const DispatchHandle& h = r.v1.handle;
  ElasticFields& f = r.fields;
  f.unaligned_per_expert = host_i32(std::vector<int32_t>(
      r.v1.unaligned_recv_tokens_per_expert.begin(), r.v1.unaligned_recv_tokens_per_expert.end()));
  f.psum_per_expert =
      host_i32(aligned_psum(r.v1.unaligned_recv_tokens_per_expert, a.expert_alignment));
  f.psum_per_scaleup_rank =
      host_i32(psum_per_scaleup_rank(received_from_each(h, buffer.rank()), args.num_scaleup_ranks));
  if (on_host(a.topk_idx)) {
    const Routing routing{.ranks = buffer.group_size(),
                          .local_experts = args.num_experts / buffer.group_size(),
                          .topk = static_cast<int>(a.topk_idx.cols)};
    f.dst_buffer_slot_idx = Tensor::empty(ep::DType::i32, a.topk_idx.rows, a.topk_idx.cols);
    send_slots(routing, a.topk_idx.as<int64_t>(), h.send_head.data<int32_t>(), a.topk_idx.rows,
               f.dst_buffer_slot_idx.data<int32_t>());
    const gpu_side::ep::EpShape shape{buffer.group_size(), buffer.ranks_per_node(),
                                      args.num_experts};
    auto tables = ep::compute_combine_order(
        a.topk_idx, shape,
        buffer.hierarchical_internode() ? ep::CombineGroups::node : ep::CombineGroups::rank);
    f.combine_order = std::move(tables.order);
    f.weight_owner = std::move(tables.weight_owner);
    if (!a.async_finish)
      f.recv_src_metadata = source_metadata(buffer, h, r.v1.recv_topk_idx, args.num_experts,
                                            args.num_max_tokens_per_rank);
  }
  return r;
}

}  // namespace proxyep::integrations::elastic
