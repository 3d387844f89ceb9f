// Dispatch's row writes on the GPU: each thread block takes a contiguous range of tokens (like
// the CPU twin's token blocks and DeepEP's channels) and, token by token, writes the token's row
// to every destination that receives it, all threads of the block cooperating on one row
// (row_rules.hpp dispatch_row with BlockLanes). Rows land at their final offsets in the
// destinations' arenas, so there is no ordering between blocks to keep: every (token,
// destination) pair owns its row. The chunk kernel does the same for one chunk of a Buffer
// stream: rows [0, rows) of one slot, row i being the token the sender listed i-th.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_block_lanes.cuh"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ep_launch.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

__global__ void dispatch_rows_kernel(ep::RowInput in, const int32_t* send_head,
                                     const ep::RowSink* sinks, int64_t num_tokens,
                                     int64_t tokens_per_block) {
  const int ranks = in.shape.num_ranks;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int64_t end = begin + tokens_per_block < num_tokens ? begin + tokens_per_block : num_tokens;
  const BlockLanes lanes;
  for (int64_t t = begin; t < end; ++t)
    for (int d = 0; d < ranks; ++d) {
      // Uniform across the block: every thread reads the same head and sink.
      const int32_t row = send_head[t * ranks + d];
      if (row < 0 || sinks[d].x == nullptr) continue;
      ep::dispatch_row(in, sinks[d], row, t, lanes);
    }
}

__global__ void dispatch_chunk_kernel(ep::RowInput in, const int32_t* tokens, ep::RowSink sink,
                                      int64_t rows, int64_t rows_per_block) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  const BlockLanes lanes;
  for (int64_t i = begin; i < end; ++i)
    ep::dispatch_row(in, sink, i, tokens[i], lanes);
}

// The launch checks both entry points share: the shape, the row format and the block size.
bool valid_launch(const ep::RowInput& in, int64_t work, int threads) {
  const ep::RowFormat& f = in.format;
  return in.shape.num_ranks >= 1 && in.shape.num_experts % in.shape.num_ranks == 0 && work >= 0 &&
         threads >= 32 && threads % 32 == 0 && threads <= 1024 && f.hidden_bytes != 0 &&
         f.topk <= static_cast<uint32_t>(ep::kMaxTopk) && (f.weights == 0 || f.weights == f.topk);
}

// The input arrays the row format reads are present.
bool input_present(const ep::RowInput& in) {
  const ep::RowFormat& f = in.format;
  return in.x != nullptr && (f.scale_cols == 0 || in.scales != nullptr) &&
         (f.topk == 0 || in.topk_idx != nullptr) && (f.weights == 0 || in.topk_weights != nullptr);
}

}  // namespace

cudaError_t launch_dispatch_chunk(const ChunkParams& p, cudaStream_t stream) {
  if (!valid_launch(p.input, p.rows, p.threads)) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (p.tokens == nullptr || p.sink.x == nullptr || !input_present(p.input))
    return cudaErrorInvalidValue;
  const int blocks = grid_blocks(p.rows, p.blocks);
  const int64_t per_block = (p.rows + blocks - 1) / blocks;
  const int used = static_cast<int>((p.rows + per_block - 1) / per_block);
  PROXYEP_LAUNCH(dispatch_chunk_kernel, used, p.threads, 0, stream)
  (p.input, p.tokens, p.sink, p.rows, per_block);
  return cudaGetLastError();
}

cudaError_t launch_dispatch_rows(const DispatchParams& p, cudaStream_t stream) {
  const ep::RowInput& in = p.input;
  if (!valid_launch(in, p.num_tokens, p.threads)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.send_head == nullptr || p.sinks == nullptr || !input_present(in))
    return cudaErrorInvalidValue;
  const int blocks = grid_blocks(p.num_tokens, p.blocks);
  const int64_t per_block = (p.num_tokens + blocks - 1) / blocks;
  const int used = static_cast<int>((p.num_tokens + per_block - 1) / per_block);
  PROXYEP_LAUNCH(dispatch_rows_kernel, used, p.threads, 0, stream)
  (in, p.send_head, p.sinks, p.num_tokens, per_block);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
