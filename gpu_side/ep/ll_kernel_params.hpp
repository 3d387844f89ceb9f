// The parameters of the low-latency (LL) EP kernels (DEEPEP_CONTRACT 2.7, 2.8), apart from how they
// are launched: plain structs that the CUDA entry points (gpu_side/cuda/ll_kernels.hpp) and the
// host-simulated device (gpu_side/device/) both take, as kernel_params.hpp is for normal mode.
// Each kernel runs one rule of ll_rules.hpp over many items, one thread block per item at a time:
//   LlPackParams     ll_pack_message    items = (token, destination message offset)
//   LlCombineParams  ll_combine_token   items = tokens, each with topk row pointers
//   LlRouteParams    ll_route (ll_route.hpp): every message's place among its expert's messages
//   LlPackRoutedParams  ll_pack_message  items = selections, placed by ll_route's output
//   LlCombineRoutedParams  ll_combine_token  items = tokens, their rows found by ll_route's output
//   LlUnpackCountedParams  ll_unpack_message  items = every source's messages, placed by the
//                    per-expert counts the sources announced (ll_counted.hpp)
//   LlReturnCountedParams  row copies  items = (expert, source) pairs of a combine's rows, sent
//                    back by the dispatch's layout_range (ll_counted.hpp)
//   MismatchParams   none: how many of two i64 arrays' elements differ (a combine's topk_idx
//                    against its dispatch's, checked where both live)
//   SizeWritesParams  ll_write_bytes  items = a step's writes to other nodes, sized by the counts
//                    (ll_counted.hpp)
//
// Every pointer is a device address (device memory, CUDA-IPC-mapped peer memory or mapped
// pinned host memory), item and sink arrays included.
#pragma once

#include "gpu_side/descriptor.hpp"
#include "gpu_side/ep/ll_rules.hpp"

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side::ep {

// Token `token` (row of x, and the index its header carries) packed as the message at
// `message`. Items of one launch may write anywhere (every destination's slot at once).
struct LlPackItem {
  std::byte* message = nullptr;  // 16-byte aligned; no two items' messages overlap
  int32_t token = 0;
};

struct LlPackParams {
  LlFormat format;                    // ll_format_error(format) == nullptr
  const uint16_t* x = nullptr;        // bf16 [num_tokens, hidden], 16-byte aligned
  const LlPackItem* items = nullptr;  // [num_items]
  int64_t num_items = 0;
  int blocks = 0;    // 0: enough to cover the GPU
  int threads = 64;  // per block, a multiple of 32 (the FP8 cast uses one lane per 128 channels)
};

// out[t] = ll_combine_token(rows + t * topk, weights + t * topk, ...) for t in [0, num_tokens).
struct LlCombineParams {
  const uint16_t* const* rows = nullptr;  // [num_tokens * topk]: bf16 [hidden] rows (16-byte
                                          // aligned) or null (skipped)
  const float* weights = nullptr;         // [num_tokens, topk]
  uint16_t* out = nullptr;                // bf16 [num_tokens, hidden], 16-byte aligned
  int64_t num_tokens = 0;
  int topk = 0;         // 1..kLlMaxTopk
  uint32_t hidden = 0;  // a multiple of 128
  int blocks = 0;       // 0: enough to cover the GPU
  int threads = 128;    // per block, a multiple of 32
};

// The routing of a low-latency dispatch where topk_idx lives (ll_route.hpp has the rule and its
// CPU twin): per expert, how many of this rank's selections name it and each selection's
// position among them, so that messages can be placed without the host reading topk_idx.
struct LlRouteParams {
  const int64_t* topk_idx = nullptr;  // [num_tokens, topk], row-major
  int64_t num_tokens = 0;
  int topk = 0;                  // 1..kLlMaxTopk
  int32_t num_experts = 0;       // >= 1; experts are numbered 0..num_experts-1
  int32_t* counts = nullptr;     // [num_experts]: selections naming each expert
  int32_t* positions = nullptr;  // [num_tokens * topk]: the selection's position, or -1
  int32_t* invalid = nullptr;    // [1]: selections naming neither an expert nor -1
  int blocks = 0;                // 0: enough to cover the GPU (a block per expert at most)
  int threads = 256;             // per block, a multiple of 32, at most 1024
};

// Every selection of this rank's tokens packed into its destination's slot with no host-made
// item list: selection i (token i / topk) naming expert e goes to message
// ll_routed_message(counts, local_experts, e, positions[i]) of slots[e / local_experts], the
// layout the host protocol sends (ll_route.hpp). Selections with position -1 are skipped.
struct LlPackRoutedParams {
  LlFormat format;                     // ll_format_error(format) == nullptr
  const uint16_t* x = nullptr;         // bf16 [num_tokens, hidden], 16-byte aligned
  const int64_t* topk_idx = nullptr;   // [num_tokens, topk]
  const int32_t* positions = nullptr;  // [num_tokens * topk], ll_route's
  const int32_t* counts = nullptr;     // [num_experts], ll_route's
  // [num_experts / local_experts]: each rank's slot, 16-byte aligned; null: that rank's
  // messages are not packed by this launch (another group's)
  std::byte* const* slots = nullptr;
  int64_t num_tokens = 0;
  int topk = 0;               // 1..kLlMaxTopk
  int32_t num_experts = 0;    // a multiple of local_experts
  int32_t local_experts = 0;  // 1..kMaxLocalExperts
  int blocks = 0;             // 0: enough to cover the GPU
  int threads = 64;           // per block, a multiple of 32
};

// The combine of the tokens a routed pack sent (LlPackRoutedParams), with no host-made row table:
// out[t] = ll_combine_token(rows, weights + t * topk, ...) where selection i's row is the one its
// expert's rank sent back at the message index the dispatch gave it, from[e / local_experts] +
// ll_routed_message(counts, local_experts, e, positions[i]) * hidden (ll_routed_row); a
// selection with position -1, or whose rank's `from` is null (masked), is skipped.
struct LlCombineRoutedParams {
  const int64_t* topk_idx = nullptr;   // [num_tokens, topk], the dispatch's
  const int32_t* positions = nullptr;  // [num_tokens * topk], the dispatch's ll_route output
  const int32_t* counts = nullptr;     // [num_experts], likewise
  // [num_experts / local_experts]: the bf16 [*, hidden] rows each rank sent back, 16-byte
  // aligned; null: skipped
  const uint16_t* const* from = nullptr;
  const float* weights = nullptr;  // [num_tokens, topk]
  uint16_t* out = nullptr;         // bf16 [num_tokens, hidden], 16-byte aligned
  int64_t num_tokens = 0;
  int topk = 0;               // 1..kLlMaxTopk
  int32_t num_experts = 0;    // a multiple of local_experts
  int32_t local_experts = 0;  // 1..kMaxLocalExperts
  uint32_t hidden = 0;        // a multiple of 128
  int blocks = 0;             // 0: enough to cover the GPU
  int threads = 128;          // per block, a multiple of 32, at most 1024
};

// A dispatch's receive with no host-made item list: every message of every source unpacked into
// the local experts' sinks, placed by the counts alone (ll_counted.hpp has the rule), with the
// per-expert row counts and layout ranges written beside. Source s's slot `from[s]` holds its
// messages grouped by local expert (the layout ll_routed_message gives the sender): counts[s *
// local_experts + e] of them for expert e. Expert e's rows are its sources' messages in rank
// order.
struct LlUnpackCountedParams {
  LlFormat format;                  // ll_format_error(format) == nullptr
  const int32_t* counts = nullptr;  // [ranks * local_experts], each >= 0
  // [ranks]: each source's slot, 16-byte aligned; null only for a source with no messages
  const std::byte* const* from = nullptr;
  const LlExpertSink* sinks = nullptr;  // [local_experts], rows 16-byte aligned
  int32_t* recv_count = nullptr;        // [local_experts]: expert e's rows
  // [local_experts * ranks]: (first row << 32) | count of source s's messages for expert e
  int64_t* layout_range = nullptr;
  int32_t ranks = 0;            // >= 1
  int32_t local_experts = 0;    // 1..kMaxLocalExperts
  int64_t rows_per_expert = 0;  // every sink's rows; an expert's counts must add up to at most this
  int blocks = 0;               // 0: enough to cover the GPU (a block per (expert, source))
  int threads = 128;            // per block, a multiple of 32, at most 1024
};

// A combine's way back with no host-made run list: expert e's rows from source s, where the
// counted unpack's layout_range put them, copied to s's return slot at the messages they came
// from (ll_counted.hpp has the rule).
struct LlReturnCountedParams {
  const int64_t* layout_range = nullptr;  // [local_experts * ranks], the dispatch's
  // bf16 [local_experts * rows_per_expert, hidden]: expert e's row r at e * rows_per_expert + r
  const uint16_t* x = nullptr;
  uint16_t* const* to =
      nullptr;                // [ranks]: each source's return slot (16-byte aligned); null: skipped
  int32_t ranks = 0;          // >= 1
  int32_t local_experts = 0;  // 1..kMaxLocalExperts
  int64_t rows_per_expert = 0;  // >= 1
  int64_t slot_rows = 0;        // the rows a return slot holds
  uint32_t hidden = 0;          // a multiple of 8 (16-byte rows)
  int blocks = 0;               // 0: enough to cover the GPU (a block per (expert, source))
  int threads = 128;            // per block, a multiple of 32, at most 1024
};

// *mismatches = the number of i in [0, count) with a[i] != b[i].
struct MismatchParams {
  const int64_t* a = nullptr;
  const int64_t* b = nullptr;
  int64_t count = 0;
  int32_t* mismatches = nullptr;  // [1]
  int blocks = 0;                 // 0: enough to cover the GPU
  int threads = 256;              // per block, a multiple of 32, at most 1024
};

// A step's writes to ranks on other nodes, made by the host once (regions, offsets, immediates)
// and sized on the device at every step from the counts it computed (ll_write_bytes): write i
// carries the messages (or rows) counted by group groups[i] of `counts`, unit_bytes each, at
// most max_bytes; a write of nothing becomes a signal (a zero-length write with its immediate:
// the receiver still counts it).
struct SizeWritesParams {
  Descriptor* writes = nullptr;     // [count], 8-byte aligned: op and length rewritten
  const int32_t* counts = nullptr;  // [(max group + 1) * group_size]
  const int32_t* groups = nullptr;  // [count]; a negative group: write i is left as it is
  int32_t group_size = 0;           // 1..kMaxLocalExperts
  uint64_t unit_bytes = 0;          // > 0
  uint64_t max_bytes = 0;           // the room at the target (a slot), >= unit_bytes
  int64_t count = 0;                // >= 0
  int blocks = 0;                   // 0: enough to cover the GPU (a thread per write)
  int threads = 128;                // per block, a multiple of 32, at most 1024
};

}  // namespace proxyep::gpu_side::ep
