// ll_route: a low-latency dispatch's routing computed from topk_idx alone, on the device that
// holds it (DeviceRuntime::ll_route) or on the host (ll_route_on_host, the CPU twin). It is the
// part of the routing that needs every selection; what follows from it per message (which rank,
// which local expert, where in the slot) is arithmetic on one selection.
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

#include "gpu_side/ep/ll_kernel_params.hpp"

namespace proxyep::gpu_side::ep {

// Whether `p`'s sizes are usable (pointers are the caller's to check): nullptr if so, else what
// is wrong.
const char* ll_route_error(const LlRouteParams& p);

// The rule on the host, in one pass. `p` must pass ll_route_error.
void ll_route_on_host(const LlRouteParams& p);

}  // namespace proxyep::gpu_side::ep
