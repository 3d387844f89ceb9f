// Host-side entry points of the low-latency (LL) EP kernels (DEEPEP_COMPAT 2.7, 2.8). Each runs
// one rule of gpu_side/ep/ll_rules.hpp over many items, one thread block per item at a time
// (BlockLanes), so a kernel's output equals the CPU twin's (the same rule on HostLanes) bit for
// bit (tests/gpu/test_gpu_ll.cpp):
//   launch_ll_pack     ll_pack_message    items = (token, destination message offset)
//   launch_ll_unpack   ll_unpack_message  items = (message, expert sink, row)
//   launch_ll_combine  ll_combine_token   items = tokens, each with topk row pointers
//
// Every pointer is a device address (device memory, CUDA-IPC-mapped peer memory or mapped
// pinned host memory), item and sink arrays included. Launches are asynchronous on `stream`;
// the return value is the launch status (cudaErrorInvalidValue for inconsistent parameters,
// before anything is launched). Plain C++ with the CUDA runtime API only, so g++-compiled code
// can call it.
#pragma once

#include "gpu_side/ep/ll_rules.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side::cuda {

// Token `token` (row of x, and the index its header carries) packed at messages + offset.
struct LlPackItem {
  uint64_t offset = 0;  // bytes; a multiple of 16
  int32_t token = 0;
};

struct LlPackParams {
  ep::LlFormat format;                // ll_format_error(format) == nullptr
  const uint16_t* x = nullptr;        // bf16 [num_tokens, hidden], 16-byte aligned
  const LlPackItem* items = nullptr;  // [num_items]
  std::byte* messages = nullptr;      // 16-byte aligned; messages must not overlap
  int64_t num_items = 0;
  int blocks = 0;    // 0: enough to cover the GPU
  int threads = 64;  // per block, a multiple of 32 (the FP8 cast uses one lane per 128 channels)
};
cudaError_t launch_ll_pack(const LlPackParams& params, cudaStream_t stream);

// The message at `message` becomes row `row` of sinks[sink].
struct LlUnpackItem {
  const std::byte* message = nullptr;  // 16-byte aligned
  int64_t row = 0;
  int32_t sink = 0;
};

struct LlUnpackParams {
  ep::LlFormat format;
  const LlUnpackItem* items = nullptr;      // [num_items]; no two write the same row of a sink
  const ep::LlExpertSink* sinks = nullptr;  // rows 16-byte aligned
  int64_t num_items = 0;
  int blocks = 0;     // 0: enough to cover the GPU
  int threads = 128;  // per block, a multiple of 32
};
cudaError_t launch_ll_unpack(const LlUnpackParams& params, cudaStream_t stream);

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
cudaError_t launch_ll_combine(const LlCombineParams& params, cudaStream_t stream);

}  // namespace proxyep::gpu_side::cuda
