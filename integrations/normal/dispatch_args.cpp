// Dispatch's argument checks (dispatch_args.hpp).
#include "integrations/normal/dispatch_args.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "proxy/session/peer_channel.hpp"

#include <algorithm>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

constexpr const char* kPhase = "dispatch";
// More scale words per token than any FP8 layout needs (hidden / 128 for hidden up to 64 Ki).
constexpr int64_t kMaxScaleCols = 512;

// The rows' tensors are where the call's backend works (the Buffer picked it from them).
void require_place(const TensorRef& t, bool on_device, std::string_view name) {
  ep::require_place(t, on_device, kPhase, name);
}

void check_x(const DispatchArgs& a, bool on_device, DispatchInput& in) {
  ep::require_defined(a.x, kPhase, "x");
  require_place(a.x, on_device, "x");
  require(a.x.dims == 2, kPhase, "x must be 2-D [num_tokens, hidden]; got {}", a.x);
  ep::require_contiguous(a.x, kPhase, "x");
  require(a.x.dtype == DType::bf16 || a.x.dtype == DType::fp8_e4m3, kPhase,
          "x must be bf16, or float8_e4m3fn with x_scales; got {}", a.x);
  in.fp8 = a.x.dtype == DType::fp8_e4m3;
  in.tokens = a.x.rows;
  in.hidden = a.x.cols;
  // Every stream carries at most all the tokens, and its words count chunks in 24 bits.
  require(static_cast<uint64_t>(in.tokens) <= proxy::kMaxStreamChunks, kPhase,
          "x has {} tokens; at most {} per call", in.tokens, proxy::kMaxStreamChunks);
  const int64_t hidden_bytes = in.hidden * static_cast<int64_t>(ep::dtype_size(a.x.dtype));
  require(hidden_bytes > 0 && hidden_bytes % ep::kRowUnitBytes == 0, kPhase,
          "hidden * element size must be a positive multiple of {} bytes; x is {} ({} bytes)",
          ep::kRowUnitBytes, a.x, hidden_bytes);
  in.format.hidden_bytes = static_cast<uint32_t>(hidden_bytes);
}

void check_scales(const DispatchArgs& a, bool on_device, DispatchInput& in) {
  if (!in.fp8) {
    require(!a.x_scales.defined(), kPhase, "x_scales given with bf16 x (scales go with FP8 x)");
    return;
  }
  // DeepEP moves the scales as opaque 4-byte words, as many per token as x_scales has columns:
  // float32 [tokens, hidden / 128], or int32 [tokens, hidden / 512] packing four UE8M0 bytes.
  ep::require_defined(a.x_scales, kPhase, "x_scales (FP8 x)");
  require_place(a.x_scales, on_device, "x_scales");
  require(a.x_scales.dtype == DType::f32 || a.x_scales.dtype == DType::i32, kPhase,
          "x_scales must be float32 (or int32 packed UE8M0); got {}", a.x_scales);
  require(a.x_scales.dims == 2 && a.x_scales.rows == in.tokens && a.x_scales.cols >= 1 &&
              a.x_scales.cols <= kMaxScaleCols,
          kPhase, "x_scales must be 2-D [num_tokens = {}, 1..{} scales]; got {}", in.tokens,
          kMaxScaleCols, a.x_scales);
  in.format.scale_cols = static_cast<uint32_t>(a.x_scales.cols);
}

void check_cached(const DispatchArgs& a, const DispatchInput& in, uint64_t buffer_id) {
  const DispatchHandle& h = *a.handle;
  require(h.buffer_id == buffer_id, kPhase, "the handle was made by another Buffer");
  require(h.num_tokens == in.tokens, kPhase, "x has {} tokens but the handle was made for {}",
          in.tokens, h.num_tokens);
  require(a.num_worst_tokens == 0, kPhase, "num_worst_tokens is not used with a handle");
  require(!a.recv_stats.defined(), kPhase,
          "cumulative_local_expert_recv_stats is counted by fresh dispatches only (as in DeepEP)");
}

// DeepEP V2's cumulative_local_expert_recv_stats: one counter per local expert, where x is.
void check_recv_stats(const DispatchArgs& a, const DispatchInput& in, bool on_device, int R) {
  if (!a.recv_stats.defined()) return;
  const std::string_view name = "cumulative_local_expert_recv_stats";
  require_place(a.recv_stats, on_device, name);
  require((a.recv_stats.dtype == DType::i32 || a.recv_stats.dtype == DType::i64) &&
              a.recv_stats.dims == 1 && a.recv_stats.rows == in.num_experts / R,
          kPhase, "{} must be int32 or int64 [num_experts / R = {}]; got {}", name,
          in.num_experts / R, a.recv_stats);
  if (on_device) ep::require_contiguous(a.recv_stats, kPhase, name);
}

void check_topk(const DispatchArgs& a, DispatchInput& in, const ep::EpShape& shape) {
  if (!a.topk_idx.defined()) {
    require(!a.topk_weights.defined(), kPhase, "topk_weights given without topk_idx");
    require(a.num_worst_tokens == 0, kPhase, "num_worst_tokens needs topk_idx");
    return;
  }
  ep::validate_topk_idx(a.topk_idx, shape, kPhase);
  require(a.topk_idx.rows == in.tokens, kPhase, "topk_idx has {} rows but x has {} tokens",
          a.topk_idx.rows, in.tokens);
  in.topk = static_cast<int>(a.topk_idx.cols);
  in.format.topk = static_cast<uint32_t>(in.topk);
  if (!a.topk_weights.defined()) return;
  ep::require_dtype(a.topk_weights, DType::f32, kPhase, "topk_weights");
  ep::require_shape(a.topk_weights, in.tokens, in.topk, kPhase, "topk_weights");
  ep::require_contiguous(a.topk_weights, kPhase, "topk_weights");
  in.weights = true;
  in.format.weights = static_cast<uint32_t>(in.topk);
}

// The layout tensors (get_dispatch_layout's) must describe x: a wrong count would misplace rows
// at the receivers.
void check_layout(const DispatchArgs& a, DispatchInput& in, int R) {
  ep::require_dtype(a.num_tokens_per_rank, DType::i32, kPhase, "num_tokens_per_rank");
  ep::require_shape(a.num_tokens_per_rank, R, -1, kPhase, "num_tokens_per_rank");
  ep::require_dtype(a.is_token_in_rank, DType::boolean, kPhase, "is_token_in_rank");
  ep::require_shape(a.is_token_in_rank, in.tokens, R, kPhase, "is_token_in_rank");
  ep::require_contiguous(a.is_token_in_rank, kPhase, "is_token_in_rank");
  ep::require_dtype(a.num_tokens_per_expert, DType::i32, kPhase, "num_tokens_per_expert");
  require(a.num_tokens_per_expert.dims == 1, kPhase,
          "num_tokens_per_expert must be 1-D [num_experts]; got {}", a.num_tokens_per_expert);
  in.num_experts = static_cast<int>(a.num_tokens_per_expert.rows);
  require(in.num_experts > 0 && in.num_experts % R == 0, kPhase,
          "num_experts ({}) must be a positive multiple of the number of ranks ({})",
          in.num_experts, R);
  require(in.num_experts / R <= ep::kMaxLocalExperts, kPhase,
          "{} experts per rank exceed the limit of {}", in.num_experts / R, ep::kMaxLocalExperts);
  const auto* in_rank = a.is_token_in_rank.as<bool>();
  const auto* per_rank = a.num_tokens_per_rank.as<int32_t>();
  for (int d = 0; d < R; ++d) {
    int64_t marked = 0;
    for (int64_t t = 0; t < in.tokens; ++t)
      marked += in_rank[t * R + d] ? 1 : 0;
    require(marked == per_rank[d], kPhase,
            "num_tokens_per_rank[{}] is {} but is_token_in_rank marks {} tokens for rank {}", d,
            per_rank[d], marked, d);
  }
}

// num_tokens_per_rdma_rank, when given (host tensors: a device call's stays on the device): the
// tokens that reach each node, each once, as get_dispatch_layout counts them across nodes.
void check_node_counts(const DispatchArgs& a, const DispatchInput& in, int R, int rpn) {
  if (!a.num_tokens_per_rdma_rank.defined()) return;
  const int nodes = (R + rpn - 1) / rpn;
  ep::require_dtype(a.num_tokens_per_rdma_rank, DType::i32, kPhase, "num_tokens_per_rdma_rank");
  ep::require_shape(a.num_tokens_per_rdma_rank, nodes, -1, kPhase, "num_tokens_per_rdma_rank");
  const auto* in_rank = a.is_token_in_rank.as<bool>();
  const auto* per_node = a.num_tokens_per_rdma_rank.as<int32_t>();
  for (int n = 0; n < nodes; ++n) {
    int64_t reached = 0;
    for (int64_t t = 0; t < in.tokens; ++t) {
      bool hit = false;
      for (int d = n * rpn; d < std::min(R, (n + 1) * rpn) && !hit; ++d)
        hit = in_rank[t * R + d];
      reached += hit ? 1 : 0;
    }
    require(reached == per_node[n], kPhase,
            "num_tokens_per_rdma_rank[{}] is {} but is_token_in_rank marks {} tokens for node {} "
            "(ranks {}..{})",
            n, per_node[n], reached, n, n * rpn, std::min(R, (n + 1) * rpn) - 1);
  }
}

}  // namespace

DispatchInput check_dispatch_args(const DispatchArgs& a, bool on_device, int ranks,
                                  int ranks_per_node, uint64_t buffer_id) {
  DispatchInput in;
  in.fabric_chunking = fabric_chunking_of(a.config, kPhase);
  check_x(a, on_device, in);
  check_scales(a, on_device, in);
  require(a.expert_alignment >= 1, kPhase, "expert_alignment must be >= 1; got {}",
          a.expert_alignment);
  require(a.num_worst_tokens >= 0, kPhase, "num_worst_tokens must be >= 0; got {}",
          a.num_worst_tokens);
  if (a.handle != nullptr) {
    in.cached = true;
    check_cached(a, in, buffer_id);
    if (a.topk_idx.defined() || a.topk_weights.defined()) {
      // The rows carry their top-k again (DeepEP V2's cached dispatch of weights); a device
      // call's values are checked in their steering copy.
      in.num_experts = a.handle->num_experts;
      require(in.num_experts > 0, kPhase, "the handle's dispatch recorded no experts");
      check_topk(a, in, {ranks, ranks_per_node, in.num_experts});
    }
    return in;  // the handle already holds recv_src_idx: rows carry no source index
  }
  check_layout(a, in, ranks);
  if (!on_device) check_node_counts(a, in, ranks, ranks_per_node);
  check_topk(a, in, {ranks, ranks_per_node, in.num_experts});
  check_recv_stats(a, in, on_device, ranks);
  in.format.src_index = 1;
  return in;
}

}  // namespace proxyep::integrations::normal
