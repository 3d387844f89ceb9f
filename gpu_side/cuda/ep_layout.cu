// get_dispatch_layout on the GPU: one thread per token applies layout_rules.hpp's per-token rule
// (the CPU twin's count_token, with atomic instead of plain increments). Counts are integers, so
// the order of the atomics does not change the result: it equals compute_dispatch_layout's.
// Each block counts into shared memory when [ranks | nodes | experts] fits, and adds its
// non-zero counters to the global ones once at the end, so hot experts cost a shared-memory
// atomic per pair instead of a contended global one.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ep_launch.hpp"
#include "gpu_side/ep/layout_rules.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr int kThreads = 256;
// Shared counters up to 48 KiB, the limit without opting in to more dynamic shared memory.
constexpr int64_t kMaxSharedCounters = 48 * 1024 / sizeof(int);

__global__ void dispatch_layout_kernel(LayoutParams p, int num_nodes, bool shared_counters) {
  PROXYEP_DYNAMIC_SHARED(int, shared);
  const int ranks = p.shape.num_ranks;
  const int width = ranks + num_nodes + p.shape.num_experts;
  int* per_rank = p.tokens_per_rank;
  int* per_node = p.tokens_per_node;
  int* per_expert = p.tokens_per_expert;
  if (shared_counters) {
    for (int i = threadIdx.x; i < width; i += blockDim.x)
      shared[i] = 0;
    __syncthreads();
    per_rank = shared;
    per_node = shared + ranks;
    per_expert = shared + ranks + num_nodes;
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.num_tokens;
       t += stride) {
    const int64_t* row = p.topk_idx + t * p.topk;
    bool* in_rank = p.is_token_in_rank + t * ranks;
    for (int r = 0; r < ranks; ++r)
      in_rank[r] = false;
    for (int k = 0; k < p.topk; ++k) {
      const int64_t expert = row[k];
      if (expert < 0) continue;
      atomicAdd(per_expert + expert, 1);
      if (ep::first_slot_of_rank(row, k, p.shape)) {
        const int rank = p.shape.rank_of_expert(expert);
        atomicAdd(per_rank + rank, 1);
        in_rank[rank] = true;
      }
      if (num_nodes > 0 && ep::first_slot_of_node(row, k, p.shape))
        atomicAdd(per_node + p.shape.node_of_rank(p.shape.rank_of_expert(expert)), 1);
    }
  }
  if (shared_counters) {
    __syncthreads();
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
      const int count = shared[i];
      if (count == 0) continue;
      if (i < ranks)
        atomicAdd(p.tokens_per_rank + i, count);
      else if (i < ranks + num_nodes)
        atomicAdd(p.tokens_per_node + (i - ranks), count);
      else
        atomicAdd(p.tokens_per_expert + (i - ranks - num_nodes), count);
    }
  }
}

}  // namespace

cudaError_t launch_dispatch_layout(const LayoutParams& p, cudaStream_t stream) {
  const ep::EpShape& s = p.shape;
  if (s.num_ranks < 1 || s.ranks_per_node < 1 || s.num_experts < 1 ||
      s.num_experts % s.num_ranks != 0 || p.num_tokens < 0 || p.topk < 0 || p.topk > ep::kMaxTopk ||
      p.tokens_per_rank == nullptr || p.tokens_per_expert == nullptr ||
      (p.num_tokens > 0 && (p.topk_idx == nullptr || p.is_token_in_rank == nullptr)))
    return cudaErrorInvalidValue;
  const int num_nodes = p.tokens_per_node != nullptr ? s.num_nodes() : 0;
  cudaError_t status = cudaMemsetAsync(p.tokens_per_rank, 0, sizeof(int32_t) * s.num_ranks, stream);
  if (status == cudaSuccess && num_nodes > 0)
    status = cudaMemsetAsync(p.tokens_per_node, 0, sizeof(int32_t) * num_nodes, stream);
  if (status == cudaSuccess)
    status = cudaMemsetAsync(p.tokens_per_expert, 0, sizeof(int32_t) * s.num_experts, stream);
  if (status != cudaSuccess || p.num_tokens == 0) return status;

  const int64_t width = int64_t{s.num_ranks} + num_nodes + s.num_experts;
  const bool shared_counters = width <= kMaxSharedCounters;
  // Enough blocks to fill the GPU a few times over, not one per token: each block flushes its
  // shared counters once, so fewer blocks mean fewer global atomics.
  const int64_t needed = (p.num_tokens + kThreads - 1) / kThreads;
  const int blocks = grid_blocks(needed, 0);
  const size_t shared_bytes = shared_counters ? static_cast<size_t>(width) * sizeof(int) : 0;
  PROXYEP_LAUNCH(dispatch_layout_kernel, blocks, kThreads, shared_bytes, stream)
  (p, num_nodes, shared_counters);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
