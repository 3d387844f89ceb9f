// ll_route: a low-latency dispatch's routing computed from topk_idx alone, on the device that
// holds it (EpKernels::ll_route, gpu_side/device/ep_kernels.hpp) or on the host (ll_route_on_host,
// the CPU twin). It is the part of the routing that needs every selection; what follows from it per
// message (which rank, which local expert, where in the slot) is arithmetic on one selection.
//
// The rule, for the selections i = token * topk + k in row-major order:
//   - counts[e] = the number of selections naming expert e, for every e in [0, num_experts);
//   - positions[i] = the number of selections j < i naming the same expert: messages of one
//     expert in token order (then k order), the order DeepEP's receivers see and combine uses;
//   - a selection of -1 (no expert) has position -1; any other value outside [0, num_experts)
//     also gets -1 and is counted in *invalid, so a caller whose topk_idx never reaches the host
//     can still refuse a bad one (naming how many selections were bad).
// Positions depend on nothing but topk_idx, so the GPU (a block per expert scanning the
// selections with warp ballots) and the twin (one pass with a counter per expert) agree exactly.
#pragma once

#include "common/host_device.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ep/ll_rules.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// The message index of a selection of expert `e` at `position` among the messages to e's rank:
// that rank's messages are grouped by local expert (counts[] of the experts before e on the
// same rank come first), in position order within one.
PROXYEP_HOST_DEVICE inline int64_t ll_routed_message(const int32_t* counts, int32_t local_experts,
                                                     int64_t e, int32_t position) {
  const int64_t first = e - e % local_experts;
  int64_t at = position;
  for (int64_t j = first; j < e; ++j)
    at += counts[j];
  return at;
}

// Where selection i's message goes under a routed pack (nullptr: the selection is not placed,
// or its rank has no slot in this launch).
PROXYEP_HOST_DEVICE inline std::byte* ll_routed_destination(const LlPackRoutedParams& p,
                                                            int64_t i) {
  const int32_t position = p.positions[i];
  if (position < 0) return nullptr;
  const int64_t e = p.topk_idx[i];
  std::byte* slot = p.slots[e / p.local_experts];
  if (slot == nullptr) return nullptr;
  const auto message =
      static_cast<uint64_t>(ll_routed_message(p.counts, p.local_experts, e, position));
  return slot + message * p.format.message_bytes();
}

// The row selection i's rank sent back to a routed combine (nullptr: skipped).
PROXYEP_HOST_DEVICE inline const uint16_t* ll_routed_row(const LlCombineRoutedParams& p,
                                                         int64_t i) {
  const int32_t position = p.positions[i];
  if (position < 0) return nullptr;
  const int64_t e = p.topk_idx[i];
  const uint16_t* from = p.from[e / p.local_experts];
  if (from == nullptr) return nullptr;
  return from + ll_routed_message(p.counts, p.local_experts, e, position) * p.hidden;
}

// Whether `p`'s sizes are usable (pointers are the caller's to check): nullptr if so, else what
// is wrong.
const char* ll_route_error(const LlRouteParams& p);

// The rule on the host, in one pass. `p` must pass ll_route_error.
void ll_route_on_host(const LlRouteParams& p);

// As ll_route_error, for a routed pack.
const char* ll_pack_routed_error(const LlPackRoutedParams& p);

// The routed pack's CPU twin: ll_pack_message for every placed selection, in order.
void ll_pack_routed_on_host(const LlPackRoutedParams& p);

// As ll_route_error, for a routed combine.
const char* ll_combine_routed_error(const LlCombineRoutedParams& p);

// The routed combine's CPU twin: ll_combine_token for every token, its rows by ll_routed_row.
void ll_combine_routed_on_host(const LlCombineRoutedParams& p);

// As ll_route_error, for a mismatch count.
const char* mismatch_error(const MismatchParams& p);

// The mismatch count's CPU twin.
void count_mismatches_on_host(const MismatchParams& p);

}  // namespace proxyep::gpu_side::ep
