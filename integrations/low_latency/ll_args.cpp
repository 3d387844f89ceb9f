// Argument checks of the low-latency calls (ll_args.hpp).
#include "integrations/low_latency/ll_args.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "integrations/low_latency/ll_call.hpp"
#include "integrations/low_latency/ll_sizes.hpp"
#include "integrations/low_latency/ll_tensors.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

uint32_t record_flags(const ep::LlFormat& f) {
  return (f.fp8 ? kFlagFp8 : 0) | (f.round_scale ? kFlagRoundScale : 0) |
         (f.ue8m0 ? kFlagUe8m0 : 0);
}

DispatchInput check_dispatch_args(const LowLatencyDispatchArgs& a, int ranks, bool on_device) {
  constexpr const char* kPhase = "low_latency_dispatch";
  const int R = ranks;
  require(!(a.async_finish && a.return_recv_hook), kPhase,
          "async_finish and return_recv_hook cannot be used together (as in DeepEP)");
  ep::require_defined(a.x, kPhase, "x");
  require(a.x.dims == 2, kPhase, "x must be 2-D [tokens, hidden]; got {}", a.x);
  const LlShape shape{.tokens = a.num_max_dispatch_tokens_per_rank,
                      .hidden = static_cast<int>(a.x.cols),
                      .experts = a.num_experts};
  check_shape(shape, R, kPhase);
  const int64_t tokens = a.x.rows;
  require(tokens <= shape.tokens, kPhase,
          "x has {} tokens, more than num_max_dispatch_tokens_per_rank ({})", tokens, shape.tokens);
  check_tensor(a.x, ep::DType::bf16, tokens, shape.hidden, true, kPhase, "x", on_device);
  ep::require_defined(a.topk_idx, kPhase, "topk_idx");
  const int64_t K = a.topk_idx.dims == 2 ? a.topk_idx.cols : 0;
  require(K >= 1 && K <= ep::kLlMaxTopk, kPhase,
          "topk_idx must be [tokens, k] with 1 <= k <= {} (DeepEP's low-latency limit); got {}",
          ep::kLlMaxTopk, a.topk_idx);
  ep::require_shape(a.topk_idx, tokens, K, kPhase, "topk_idx");
  if (on_device)
    check_tensor(a.topk_idx, ep::DType::i64, tokens, K, true, kPhase, "topk_idx", true);
  else
    ep::validate_topk_idx(a.topk_idx, {R, 1, shape.experts}, kPhase);  // dtype, values
  const ep::LlFormat format{.hidden = static_cast<uint32_t>(shape.hidden),
                            .fp8 = a.use_fp8,
                            .round_scale = a.round_scale,
                            .ue8m0 = a.use_ue8m0};
  if (const char* why = ep::ll_format_error(format))
    fail(kPhase, "{} (hidden {})", why, shape.hidden);
  const int local = shape.experts / R;
  if (a.cumulative_local_expert_recv_stats.defined())
    check_tensor(a.cumulative_local_expert_recv_stats, ep::DType::i32, local, -1, on_device, kPhase,
                 "cumulative_local_expert_recv_stats", on_device);
  if (a.dispatch_wait_recv_cost_stats.defined())
    check_tensor(a.dispatch_wait_recv_cost_stats, ep::DType::i64, R, -1, on_device, kPhase,
                 "dispatch_wait_recv_cost_stats", on_device);
  return {shape, format, tokens, K};
}

const std::byte* check_combine_args(const LowLatencyCombineArgs& a, uint64_t buffer_id,
                                    const ep::TensorRef& combine_buffer, bool on_device) {
  constexpr const char* kPhase = "low_latency_combine";
  require(!(a.async_finish && a.return_recv_hook), kPhase,
          "async_finish and return_recv_hook cannot be used together (as in DeepEP)");
  require(!a.use_logfmt, kPhase,
          "use_logfmt is not supported: ProxyEP combines in BF16 (pass use_logfmt=False)");
  require(a.handle != nullptr && a.handle->dispatched != nullptr &&
              a.handle->dispatched->buffer_id == buffer_id,
          kPhase, "the handle was not made by this Buffer's low_latency_dispatch");
  std::shared_ptr<const CallState> dispatched = a.handle->dispatched;
  const CallState& d = *dispatched;
  require(d.received, kPhase,
          "the dispatch of this handle has not received its tokens yet: call its hook (or wait "
          "for its event) first");
  // A device dispatch's routing lives on the device, a host dispatch's on the host: the combine
  // that checks and follows it must be on the same side.
  require(d.routing.has_value() == on_device, kPhase,
          "the handle came from a dispatch with {} tensors; its combine must pass {} tensors too",
          on_device ? "host" : "device", on_device ? "host" : "device");
  const int R = d.ranks, local = d.shape.experts / R, H = d.shape.hidden;
  const int64_t rows = static_cast<int64_t>(local) * R * d.shape.tokens;
  const std::byte* x = nullptr;
  if (a.zero_copy) {
    require(combine_buffer.defined() && combine_buffer.rows == rows && combine_buffer.cols == H,
            kPhase,
            "zero_copy: write the expert outputs into get_next_low_latency_combine_buffer(handle) "
            "first");
    x = static_cast<const std::byte*>(combine_buffer.data);
  } else {
    check_tensor(a.x, ep::DType::bf16, rows, H, true, kPhase, "x", on_device);
    x = static_cast<const std::byte*>(a.x.data);
  }
  check_tensor(a.topk_idx, ep::DType::i64, d.num_tokens, d.topk, on_device, kPhase, "topk_idx",
               on_device);
  if (!on_device)
    for (int t = 0; t < d.num_tokens; ++t)
      for (int k = 0; k < d.topk; ++k)
        require(a.topk_idx.at<int64_t>(t, k) == d.topk_idx[static_cast<size_t>(t) * d.topk + k],
                kPhase, "topk_idx[{}][{}] differs from the one this handle's dispatch routed by", t,
                k);
  check_tensor(a.topk_weights, ep::DType::f32, d.num_tokens, d.topk, on_device, kPhase,
               "topk_weights", on_device);
  if (a.out.defined())
    check_tensor(a.out, ep::DType::bf16, d.num_tokens, H, true, kPhase, "out", on_device);
  if (a.combine_wait_recv_cost_stats.defined())
    check_tensor(a.combine_wait_recv_cost_stats, ep::DType::i64, R, -1, on_device, kPhase,
                 "combine_wait_recv_cost_stats", on_device);
  return x;
}

}  // namespace proxyep::integrations::low_latency
