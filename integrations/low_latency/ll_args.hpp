// The low-latency calls' argument checks: everything that can be wrong with one rank's call is
// found here, before anything is sent, and throws proxyep::Error naming the argument; the Buffer
// stays usable. (What only shows across ranks — different sizes — is the agreement's.)
#pragma once

#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/low_latency/ll_record.hpp"
#include "integrations/low_latency_types.hpp"

#include <cstddef>
#include <cstdint>

namespace proxyep::integrations::low_latency {

// A dispatch's checked arguments.
struct DispatchInput {
  LlShape shape;
  gpu_side::ep::LlFormat format;
  int64_t tokens = 0;  // T'
  int64_t topk = 0;    // K
};

// `on_device`: x, topk_idx and the statistics are device memory; topk_idx's values are then not
// read here (the dispatch refuses bad ones from the device's routing, before anything is sent).
DispatchInput check_dispatch_args(const LowLatencyDispatchArgs& args, int ranks, bool on_device);

// Checks a combine against the dispatch of its handle (which must be this Buffer's, received);
// returns where its expert outputs are (x, or the zero-copy buffer). `on_device`: x, topk_idx,
// the weights, `out` and the statistics are device memory, contiguous; whether topk_idx equals
// the dispatch's is then not checked here (the combine counts the differences on the device).
const std::byte* check_combine_args(const LowLatencyCombineArgs& args, uint64_t buffer_id,
                                    const gpu_side::ep::TensorRef& combine_buffer, bool on_device);

// The format flags a record carries (kFlag*).
uint32_t record_flags(const gpu_side::ep::LlFormat& format);

}  // namespace proxyep::integrations::low_latency
