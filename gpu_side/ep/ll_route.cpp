// The CPU twin of the low-latency routing kernel (ll_route.hpp).
#include "gpu_side/ep/ll_route.hpp"

#include "gpu_side/ep/ep_shape.hpp"

#include <algorithm>

namespace proxyep::gpu_side::ep {

const char* ll_route_error(const LlRouteParams& p) {
  if (p.num_tokens < 0) return "a negative number of tokens";
  if (p.topk < 1 || p.topk > kLlMaxTopk) return "topk outside 1..11";
  if (p.num_experts < 1) return "no experts";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
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
  if (ll_format_error(p.format) != nullptr) return ll_format_error(p.format);
  if (p.num_tokens < 0) return "a negative number of tokens";
  if (p.topk < 1 || p.topk > kLlMaxTopk) return "topk outside 1..11";
  if (p.local_experts < 1 || p.local_experts > kMaxLocalExperts)
    return "local experts outside 1..1024";
  if (p.num_experts < 1 || p.num_experts % p.local_experts != 0)
    return "num_experts not a positive multiple of local_experts";
  if (p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return "threads per block not a multiple of 32 in 32..1024";
  return nullptr;
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

}  // namespace proxyep::gpu_side::ep
