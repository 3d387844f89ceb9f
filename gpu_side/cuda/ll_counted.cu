// The counted unpack and its way back (gpu_side/ep/ll_counted.hpp): a block per (local expert,
// source) pair, grid-stride, finds the pair's place from the counts (every thread the same sums:
// R + L loads, from L2 after the first block) and unpacks its messages (or copies its rows back)
// one after another with all its threads, so the kernel needs no item list from the host and no
// ordering between blocks (pairs own disjoint rows). Pair q = e * R + s is also layout_range's
// index.
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ep_block_lanes.cuh"
#include "gpu_side/cuda/ep_launch.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"
#include "gpu_side/ep/ll_counted.hpp"

#include <cuda_runtime.h>

namespace proxyep::gpu_side::cuda {
namespace {

__global__ void ll_unpack_counted_kernel(ep::LlUnpackCountedParams p) {
  const BlockLanes lanes;
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  for (int64_t q = blockIdx.x; q < pairs; q += gridDim.x)
    ep::ll_unpack_counted_pair(p, q, lanes);
}

__global__ void ll_return_counted_kernel(ep::LlReturnCountedParams p) {
  const BlockLanes lanes;
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  for (int64_t q = blockIdx.x; q < pairs; q += gridDim.x)
    ep::ll_return_counted_pair(p, q, lanes);
}

// A thread per write: a few counts each.
__global__ void ll_write_bytes_kernel(ep::SizeWritesParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count;
       i += stride)
    ep::ll_write_bytes(p, i);
}

}  // namespace

cudaError_t launch_ll_write_bytes(const SizeWritesParams& p, cudaStream_t stream) {
  if (ep::ll_write_bytes_error(p) != nullptr) return cudaErrorInvalidValue;
  if (p.count == 0) return cudaSuccess;
  PROXYEP_LAUNCH(ll_write_bytes_kernel, grid_blocks(p.count, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

cudaError_t launch_ll_unpack_counted(const LlUnpackCountedParams& p, cudaStream_t stream) {
  if (ep::ll_unpack_counted_error(p) != nullptr) return cudaErrorInvalidValue;
  if (p.counts == nullptr || p.from == nullptr || p.sinks == nullptr || p.recv_count == nullptr ||
      p.layout_range == nullptr)
    return cudaErrorInvalidValue;
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  PROXYEP_LAUNCH(ll_unpack_counted_kernel, grid_blocks(pairs, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

cudaError_t launch_ll_return_counted(const LlReturnCountedParams& p, cudaStream_t stream) {
  if (ep::ll_return_counted_error(p) != nullptr) return cudaErrorInvalidValue;
  if (p.layout_range == nullptr || p.x == nullptr || p.to == nullptr) return cudaErrorInvalidValue;
  const int64_t pairs = static_cast<int64_t>(p.local_experts) * p.ranks;
  PROXYEP_LAUNCH(ll_return_counted_kernel, grid_blocks(pairs, p.blocks), p.threads, 0, stream)(p);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
