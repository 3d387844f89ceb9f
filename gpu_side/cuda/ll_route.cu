// The low-latency routing kernel (gpu_side/ep/ll_route.hpp): a block per expert scans every
// selection in chunks of blockDim, and a selection's position is the number of earlier matches:
// those of earlier chunks (a running base), of earlier warps of this chunk (warp totals in
// shared memory) and of earlier lanes of its warp (a ballot masked below the lane). The result
// depends only on topk_idx, never on scheduling, so it equals the CPU twin's exactly. Each block
// reads topk_idx once per expert: LL dispatches hold at most a few thousand selections, and the
// reads hit L2 after the first expert. The routed pack then places every message by it, and the
// routed combine finds every row the ranks sent back by it.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_block_lanes.cuh"
#include "gpu_side/cuda/ep_launch.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"
#include "gpu_side/ep/ll_route.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr int kMaxWarps = 1024 / 32;

__global__ void ll_route_kernel(ep::LlRouteParams p) {
  PROXYEP_SHARED_ARRAY(int32_t, warp_totals, kMaxWarps);
  const int64_t selections = p.num_tokens * p.topk;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  const unsigned below_lane = (1u << lane) - 1u;
  for (int32_t e = blockIdx.x; e < p.num_experts; e += gridDim.x) {
    int32_t base = 0;  // matches in earlier chunks; the same in every thread of the block
    for (int64_t start = 0; start < selections; start += blockDim.x) {
      const int64_t i = start + threadIdx.x;
      const bool match = i < selections && p.topk_idx[i] == e;
      const unsigned ballot = __ballot_sync(0xffffffffu, match);
      if (lane == 0) warp_totals[warp] = __popc(ballot);
      __syncthreads();
      int32_t before = __popc(ballot & below_lane), chunk = 0;
      for (int w = 0; w < warps; ++w) {
        const int32_t total = warp_totals[w];
        if (w < warp) before += total;
        chunk += total;
      }
      if (match) p.positions[i] = base + before;
      base += chunk;
      __syncthreads();  // warp_totals is rewritten by the next chunk
    }
    if (threadIdx.x == 0) p.counts[e] = base;
  }
  // Selections of no expert: every block takes a share (*invalid was zeroed before the launch).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < selections;
       i += stride) {
    const int64_t e = p.topk_idx[i];
    if (e >= 0 && e < p.num_experts) continue;
    p.positions[i] = -1;
    if (e != -1) atomicAdd(p.invalid, 1);
  }
}

// A block per placed selection (grid-stride), all its threads packing the one message.
__global__ void ll_pack_routed_kernel(ep::LlPackRoutedParams p) {
  const BlockLanes lanes;
  const int64_t selections = p.num_tokens * p.topk;
  for (int64_t i = blockIdx.x; i < selections; i += gridDim.x) {
    std::byte* to = ep::ll_routed_destination(p, i);
    if (to == nullptr) continue;
    const auto token = static_cast<int32_t>(i / p.topk);
    ep::ll_pack_message(p.format, p.x + static_cast<int64_t>(token) * p.format.hidden, token, to,
                        lanes);
  }
}

// A block per token (grid-stride): its rows found by the routing into shared memory, then every
// thread of the block reduces its lanes of the token.
__global__ void ll_combine_routed_kernel(ep::LlCombineRoutedParams p) {
  PROXYEP_SHARED_ARRAY(const uint16_t*, rows, ep::kLlMaxTopk);
  const BlockLanes lanes;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    if (threadIdx.x < p.topk) rows[threadIdx.x] = ep::ll_routed_row(p, t * p.topk + threadIdx.x);
    __syncthreads();
    ep::ll_combine_token(rows, p.weights + t * p.topk, p.topk, p.hidden, p.out + t * p.hidden,
                         lanes);
    __syncthreads();  // rows is rewritten for the next token
  }
}

// Grid-stride; each thread adds its count once (*mismatches was zeroed before the launch).
__global__ void count_mismatches_kernel(ep::MismatchParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int32_t mismatches = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count;
       i += stride)
    mismatches += p.a[i] != p.b[i] ? 1 : 0;
  if (mismatches > 0) atomicAdd(p.mismatches, mismatches);
}

}  // namespace

cudaError_t launch_ll_combine_routed(const ep::LlCombineRoutedParams& p, cudaStream_t stream) {
  if (ep::ll_combine_routed_error(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.topk_idx == nullptr || p.positions == nullptr || p.counts == nullptr || p.from == nullptr ||
      p.weights == nullptr || p.out == nullptr || (reinterpret_cast<uintptr_t>(p.out) & 15u) != 0)
    return cudaErrorInvalidValue;
  PROXYEP_LAUNCH(ll_combine_routed_kernel, grid_blocks(p.num_tokens, p.blocks), p.threads, 0,
                 stream)
  (p);
  return cudaGetLastError();
}

cudaError_t launch_count_mismatches(const ep::MismatchParams& p, cudaStream_t stream) {
  if (ep::mismatch_error(p) != nullptr || p.mismatches == nullptr ||
      (p.count > 0 && (p.a == nullptr || p.b == nullptr)))
    return cudaErrorInvalidValue;
  cudaError_t status = cudaMemsetAsync(p.mismatches, 0, sizeof(int32_t), stream);
  if (status != cudaSuccess || p.count == 0) return status;
  PROXYEP_LAUNCH(count_mismatches_kernel, grid_blocks(p.count, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

cudaError_t launch_ll_pack_routed(const ep::LlPackRoutedParams& p, cudaStream_t stream) {
  if (ep::ll_pack_routed_error(p) != nullptr) return cudaErrorInvalidValue;
  const int64_t selections = p.num_tokens * p.topk;
  if (selections == 0) return cudaSuccess;
  if (p.x == nullptr || p.topk_idx == nullptr || p.positions == nullptr || p.counts == nullptr ||
      p.slots == nullptr || (reinterpret_cast<uintptr_t>(p.x) & 15u) != 0)
    return cudaErrorInvalidValue;
  PROXYEP_LAUNCH(ll_pack_routed_kernel, grid_blocks(selections, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

cudaError_t launch_ll_route(const ep::LlRouteParams& p, cudaStream_t stream) {
  if (ep::ll_route_error(p) != nullptr || p.counts == nullptr || p.invalid == nullptr ||
      (p.num_tokens > 0 && (p.topk_idx == nullptr || p.positions == nullptr)))
    return cudaErrorInvalidValue;
  cudaError_t status = cudaMemsetAsync(p.invalid, 0, sizeof(int32_t), stream);
  if (status != cudaSuccess) return status;
  PROXYEP_LAUNCH(ll_route_kernel, grid_blocks(p.num_experts, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
