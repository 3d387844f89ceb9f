// Combine's reduce on the GPU: one thread block per token (grid-stride over tokens), each thread
// reducing 16-byte chunks of the row (row_rules.hpp combine_token with BlockLanes). The rule
// fixes each element's order of additions, so the result equals the CPU twin's bit for bit;
// V2's order and weight owners come in the same CombineInput, so the kernel follows them too.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_block_lanes.cuh"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ep_launch.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

__global__ void combine_kernel(ep::CombineInput in, int64_t num_tokens) {
  const BlockLanes lanes;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x)
    ep::combine_token(in, t, lanes);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

cudaError_t launch_combine(const CombineParams& p, cudaStream_t stream) {
  const ep::CombineInput& in = p.input;
  if (in.num_ranks < 1 || in.hidden <= 0 || in.hidden % ep::kCombineChunk != 0 || in.topk < 0 ||
      p.num_tokens < 0 || p.threads < 32 || p.threads % 32 != 0 || p.threads > 1024)
    return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  // Chunks are moved with 16-byte accesses.
  // (The block pointers live in device memory: their 16-byte alignment is the caller's duty.)
  if (in.block_rows == nullptr || in.send_head == nullptr || in.out == nullptr ||
      (in.block_chunk_rows != nullptr && in.block_chunks == nullptr) || !aligned16(in.out) ||
      !aligned16(in.bias0) || !aligned16(in.bias1) ||
      (in.topk > 0 && (in.block_weights == nullptr || in.out_weights == nullptr)))
    return cudaErrorInvalidValue;
  PROXYEP_LAUNCH(combine_kernel, grid_blocks(p.num_tokens, p.blocks), p.threads, 0, stream)
  (in, p.num_tokens);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
