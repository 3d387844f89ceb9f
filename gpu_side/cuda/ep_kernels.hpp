// Host-side entry points of the normal-mode EP kernels (DEEPEP_COMPAT 2.2, 2.3, 2.5). Each runs
// the same per-token rule as its CPU twin, from the same header:
//   launch_dispatch_layout  layout_rules.hpp   (twin: ep::compute_dispatch_layout)
//   launch_dispatch_rows    row_rules.hpp dispatch_row   (twin: write_row in buffer_rows.hpp)
//   launch_combine          row_rules.hpp combine_token  (twin: combine_tokens in buffer_rows.hpp)
// so a kernel's output equals the twin's bit for bit (tests/gpu/test_gpu_ep.cpp).
//
// Every pointer is a device address (device memory, CUDA-IPC-mapped peer memory or mapped
// pinned host memory). Launches are asynchronous on `stream`; the return value is the launch
// status (cudaErrorInvalidValue for inconsistent parameters, before anything is launched). Plain
// C++ with the CUDA runtime API only, so g++-compiled code can call it.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proxyep::gpu_side::cuda {

// get_dispatch_layout. tokens_per_node may be null (DeepEP returns None for <= 8 ranks); the
// counters are zeroed on `stream` first, so they need no preparation.
struct LayoutParams {
  const int64_t* topk_idx = nullptr;  // [num_tokens, topk], entries in [-1, num_experts)
  int64_t num_tokens = 0;
  int topk = 0;  // <= kMaxTopk
  ep::EpShape shape;
  int32_t* tokens_per_rank = nullptr;    // [num_ranks]
  int32_t* tokens_per_node = nullptr;    // [num_nodes] or null
  int32_t* tokens_per_expert = nullptr;  // [num_experts]
  bool* is_token_in_rank = nullptr;      // [num_tokens, num_ranks], fully written
};
cudaError_t launch_dispatch_layout(const LayoutParams& params, cudaStream_t stream);

// Dispatch's row writes: token t goes to every destination d with send_head[t][d] >= 0, as row
// send_head[t][d] of sinks[d]. A sink whose x is null is skipped (a destination another pass
// handles, e.g. one on another node that goes through staging and the fabric). One thread block
// per token range, all threads of the block on one row at a time.
struct DispatchParams {
  ep::RowInput input;                  // input.shape.num_ranks destinations
  const int32_t* send_head = nullptr;  // [num_tokens, num_ranks], -1 = not sent
  const ep::RowSink* sinks = nullptr;  // [num_ranks], the array itself in device memory
  int64_t num_tokens = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 256;  // per block, a multiple of 32
};
cudaError_t launch_dispatch_rows(const DispatchParams& params, cudaStream_t stream);

// One chunk of a Buffer stream (integrations/normal/chunk_plan.hpp): row i of `sink` is token
// tokens[i] of the input, for i in [0, rows); the sink is the chunk's slot (laid out as
// RowAreas of `rows` rows, first_row 0), in a peer's IPC-mapped memory or in mapped staging.
// Rows are spread over the blocks; all threads of a block cooperate on one row at a time.
struct ChunkParams {
  ep::RowInput input;
  const int32_t* tokens = nullptr;  // [rows], device memory
  ep::RowSink sink;
  int64_t rows = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 256;  // per block, a multiple of 32
};
cudaError_t launch_dispatch_chunk(const ChunkParams& params, cudaStream_t stream);

// Combine's reduce: out[t] for t in [0, num_tokens), one thread block per token at a time.
// input.hidden must be a multiple of kCombineChunk and rows, biases and out 16-byte aligned.
struct CombineParams {
  ep::CombineInput input;
  int64_t num_tokens = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 128;  // per block, a multiple of 32
};
cudaError_t launch_combine(const CombineParams& params, cudaStream_t stream);

// Throws proxyep::Error(phase, "<what> failed: <CUDA message>") unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* phase, const char* what);

}  // namespace proxyep::gpu_side::cuda
