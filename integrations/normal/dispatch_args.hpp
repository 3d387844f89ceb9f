// The checks of a dispatch's arguments, all made on the calling rank before anything is sent:
// a rank whose input is bad throws proxyep::Error("dispatch") naming the argument and leaves the
// Buffer usable. What the checks establish is summed up in DispatchInput.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "integrations/normal/chunk_plan.hpp"
#include "integrations/normal_types.hpp"

#include <cstdint>

namespace proxyep::integrations::normal {

struct DispatchInput {
  bool fp8 = false;
  bool cached = false;  // a handle gives the routing
  int64_t tokens = 0, hidden = 0;
  int topk = 0;  // 0: no top-k selections travel (cached, or none given)
  bool weights = false;
  int num_experts = 0;  // fresh dispatches only
  gpu_side::ep::RowFormat format;
  FabricChunking fabric_chunking;  // the Config's RDMA chunk sizes (chunk_plan.hpp)
};

// `ranks`, `ranks_per_node`: the group's; `buffer_id`: the Buffer whose handles are valid;
// `on_device`: where x and x_scales must be (the values read here, of the layout tensors and
// topk_idx, are always host memory: a device call passes host copies of them).
DispatchInput check_dispatch_args(const DispatchArgs& args, bool on_device, int ranks,
                                  int ranks_per_node, uint64_t buffer_id);

}  // namespace proxyep::integrations::normal
