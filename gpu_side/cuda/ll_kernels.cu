// The low-latency kernels: each thread block takes items grid-stride and runs one ll_rules.hpp
// rule per item with all its threads (BlockLanes), the same code the CPU twins run on one lane.
// Items own disjoint outputs (a message, a row, a token), so blocks need no ordering.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_block_lanes.cuh"
#include "gpu_side/cuda/ep_launch.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

__global__ void ll_pack_kernel(ep::LlFormat f, const uint16_t* x, const LlPackItem* items,
                               int64_t num_items) {
  const BlockLanes lanes;
  for (int64_t i = blockIdx.x; i < num_items; i += gridDim.x) {
    const LlPackItem item = items[i];
    ep::ll_pack_message(f, x + static_cast<int64_t>(item.token) * f.hidden, item.token,
                        item.message, lanes);
  }
}

__global__ void ll_combine_kernel(const uint16_t* const* rows, const float* weights, uint16_t* out,
                                  int64_t num_tokens, int topk, uint32_t hidden) {
  const BlockLanes lanes;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x)
    ep::ll_combine_token(rows + t * topk, weights + t * topk, topk, hidden, out + t * hidden,
                         lanes);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

bool valid_threads(int threads) {
  return threads >= 32 && threads % 32 == 0 && threads <= 1024;
}

}  // namespace

cudaError_t launch_ll_pack(const LlPackParams& p, cudaStream_t stream) {
  if (ep::ll_format_error(p.format) != nullptr || p.num_items < 0 || !valid_threads(p.threads))
    return cudaErrorInvalidValue;
  if (p.num_items == 0) return cudaSuccess;
  if (p.x == nullptr || p.items == nullptr || !aligned16(p.x)) return cudaErrorInvalidValue;
  PROXYEP_LAUNCH(ll_pack_kernel, grid_blocks(p.num_items, p.blocks), p.threads, 0, stream)
  (p.format, p.x, p.items, p.num_items);
  return cudaGetLastError();
}

cudaError_t launch_ll_combine(const LlCombineParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.topk < 1 || p.topk > ep::kLlMaxTopk || p.hidden == 0 ||
      p.hidden % ep::kLlScaleGroup != 0 || !valid_threads(p.threads))
    return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.rows == nullptr || p.weights == nullptr || p.out == nullptr || !aligned16(p.out))
    return cudaErrorInvalidValue;
  PROXYEP_LAUNCH(ll_combine_kernel, grid_blocks(p.num_tokens, p.blocks), p.threads, 0, stream)
  (p.rows, p.weights, p.out, p.num_tokens, p.topk, p.hidden);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
