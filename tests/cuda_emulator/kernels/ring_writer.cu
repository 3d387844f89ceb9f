// The concurrent ring writer (ring_writer.hpp).
#include "tests/cuda_emulator/kernels/ring_writer.hpp"

#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ring_producer.cuh"

namespace proxyep::cuemu_testing {
namespace {

__global__ void ring_writer_kernel(gpu_side::cuda::DeviceRing ring,
                                   const gpu_side::Descriptor* descriptors, int64_t count,
                                   uint64_t timeout_ns, unsigned long long* gave_up) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    if (!gpu_side::cuda::device_push(ring, descriptors[i], timeout_ns)) {
      atomicAdd(gave_up, 1ull);
      return;  // the ring is dead: its later positions would only time out too
    }
  }
}

}  // namespace

cudaError_t launch_ring_writer(const RingWriterArgs& args, unsigned blocks, unsigned threads,
                               cudaStream_t stream) {
  const gpu_side::cuda::DeviceRing ring{args.header, gpu_side::ring_slots(args.header),
                                        args.capacity, args.head, args.cached_tail};
  PROXYEP_LAUNCH(ring_writer_kernel, blocks, threads, 0, stream)
  (ring, args.descriptors, args.count, args.timeout_ns, args.gave_up);
  return cudaGetLastError();
}

}  // namespace proxyep::cuemu_testing
