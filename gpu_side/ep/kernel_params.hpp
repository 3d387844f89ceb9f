// The parameters of the normal-mode EP kernels (DEEPEP_CONTRACT 2.2, 2.3, 2.5), apart from how they
// are launched: plain structs of pointers and sizes that the CUDA entry points
// (gpu_side/cuda/ep_kernels.hpp) and the host-simulated device (gpu_side/device/) both take, so a
// backend hands the same parameters to either.
//
// Every pointer is a device address (device memory, CUDA-IPC-mapped peer memory or mapped
// pinned host memory), including the arrays a parameter points to (DispatchParams::sinks,
// ChunkParams::tokens, CombineInput's per-rank tables and V2's order and weight_owner).
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side::ep {

// get_dispatch_layout. tokens_per_node may be null (DeepEP returns None for <= 8 ranks); the
// counters are zeroed (in stream order) first, so they need no preparation.
struct LayoutParams {
  const int64_t* topk_idx = nullptr;  // [num_tokens, topk], entries in [-1, num_experts)
  int64_t num_tokens = 0;
  int topk = 0;  // <= kMaxTopk
  EpShape shape;
  int32_t* tokens_per_rank = nullptr;    // [num_ranks]
  int32_t* tokens_per_node = nullptr;    // [num_nodes] or null
  int32_t* tokens_per_expert = nullptr;  // [num_experts]
  bool* is_token_in_rank = nullptr;      // [num_tokens, num_ranks], fully written
};

// Dispatch's row writes: token t goes to every destination d with send_head[t][d] >= 0, as row
// send_head[t][d] of sinks[d]. A sink whose x is null is skipped (a destination another pass
// handles, e.g. one on another node that goes through staging and the fabric). One thread block
// per token range, all threads of the block on one row at a time.
struct DispatchParams {
  RowInput input;                      // input.shape.num_ranks destinations
  const int32_t* send_head = nullptr;  // [num_tokens, num_ranks], -1 = not sent
  const RowSink* sinks = nullptr;      // [num_ranks], the array itself in device memory
  int64_t num_tokens = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 256;  // per block, a multiple of 32
};

// One chunk of a Buffer stream (integrations/normal/chunk_plan.hpp): row i of `sink` is token
// tokens[i] of the input, for i in [0, rows); the sink is the chunk's slot (laid out as
// RowAreas of `rows` rows, first_row 0), in a peer's IPC-mapped memory or in mapped staging.
// Rows are spread over the blocks; all threads of a block cooperate on one row at a time.
struct ChunkParams {
  RowInput input;
  const int32_t* tokens = nullptr;  // [rows], device memory
  RowSink sink;
  int64_t rows = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 256;  // per block, a multiple of 32
};

// Combine's reduce: out[t] for t in [0, num_tokens), one thread block per token at a time.
// input.hidden must be a multiple of kCombineChunk and rows, biases and out 16-byte aligned.
struct CombineParams {
  CombineInput input;
  int64_t num_tokens = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 128;  // per block, a multiple of 32
};

// to[i] += from[i] for i in [0, count), as int32 or int64: the statistics tensors a call adds to
// (DeepEP's LL kernels add atomically; one launch here owns its elements).
struct AddParams {
  bool wide = false;  // int64 (else int32)
  void* to = nullptr;
  const void* from = nullptr;
  int64_t count = 0;
};

// Many copies in one launch: runs[i].bytes bytes from runs[i].from to runs[i].to (device
// addresses; no run overlaps another's bytes). A low-latency combine sends each home rank's rows
// as one run per local expert: one launch instead of one copy per run.
struct CopyRun {
  std::byte* to = nullptr;
  const std::byte* from = nullptr;
  uint64_t bytes = 0;
};
struct CopyRunsParams {
  const CopyRun* runs = nullptr;  // device-reachable
  int64_t num_runs = 0;
};

}  // namespace proxyep::gpu_side::ep
