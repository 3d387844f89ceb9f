// The CPU twin of the low-latency routing kernel (ll_route.hpp).
#include "gpu_side/ep/ll_route.hpp"

#include "gpu_side/ep/ep_shape.hpp"

#include <algorithm>

namespace proxyep::gpu_side::ep {

namespace {

// What both kernels over the selections need of their sizes.
const char* selections_error(int64_t num_tokens, int topk, int32_t num_experts, int threads) {
  if (num_tokens < 0) return "a negative number of tokens";
  if (topk < 1 || topk > kLlMaxTopk) return "topk outside 1..11";
  if (num_experts < 1) return "no experts";
  if (threads < 32 || threads % 32 != 0 || threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
}

// What both kernels that place selections by rank need of their sizes.
const char* placement_error(int64_t num_tokens, int topk, int32_t num_experts,
                            int32_t local_experts, int threads) {
  if (const char* sizes = selections_error(num_tokens, topk, num_experts, threads)) return sizes;
  if (local_experts < 1 || local_experts > kMaxLocalExperts) return "local experts outside 1..1024";
  if (num_experts % local_experts != 0)
    return "num_experts not a positive multiple of local_experts";
  return nullptr;
}

}  // namespace

const char* ll_route_error(const LlRouteParams& p) {
  return selections_error(p.num_tokens, p.topk, p.num_experts, p.threads);
}

void ll_route_on_host(const LlRouteParams& p) {
  std::fill_n(p.counts, p.num_experts, 0);
  int32_t invalid = 0;
  const int64_t selections = p.num_tokens * p.topk;
  for (int64_t i = 0; i < selections; ++i) {
    const int64_t e = p.topk_idx[i];
    if (e >= 0 && e < p.num_experts) {
      p.positions[i] = p.counts[e]++;
      continue;
    }
    p.positions[i] = -1;
    if (e != -1) ++invalid;
  }
  *p.invalid = invalid;
}

const char* ll_pack_routed_error(const LlPackRoutedParams& p) {
  if (const char* format = ll_format_error(p.format)) return format;
  return placement_error(p.num_tokens, p.topk, p.num_experts, p.local_experts, p.threads);
}

void ll_pack_routed_on_host(const LlPackRoutedParams& p) {
  const int64_t selections = p.num_tokens * p.topk;
  for (int64_t i = 0; i < selections; ++i) {
    std::byte* to = ll_routed_destination(p, i);
    if (to == nullptr) continue;
    const auto token = static_cast<int32_t>(i / p.topk);
    ll_pack_message(p.format, p.x + static_cast<int64_t>(token) * p.format.hidden, token, to,
                    HostLanes{});
  }
}

const char* ll_combine_routed_error(const LlCombineRoutedParams& p) {
  if (p.hidden == 0 || p.hidden % kLlScaleGroup != 0)
    return "hidden not a positive multiple of 128";
  return placement_error(p.num_tokens, p.topk, p.num_experts, p.local_experts, p.threads);
}

void ll_combine_routed_on_host(const LlCombineRoutedParams& p) {
  const uint16_t* rows[kLlMaxTopk];
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int k = 0; k < p.topk; ++k)
      rows[k] = ll_routed_row(p, t * p.topk + k);
    ll_combine_token(rows, p.weights + t * p.topk, p.topk, p.hidden, p.out + t * p.hidden,
                     HostLanes{});
  }
}

const char* mismatch_error(const MismatchParams& p) {
  if (p.count < 0) return "a negative count";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
}

void count_mismatches_on_host(const MismatchParams& p) {
  int32_t mismatches = 0;
  for (int64_t i = 0; i < p.count; ++i)
    mismatches += p.a[i] != p.b[i] ? 1 : 0;
  *p.mismatches = mismatches;
}

}  // namespace proxyep::gpu_side::ep
