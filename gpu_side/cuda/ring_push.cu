// The stream-ordered descriptor push (ring_push.hpp).
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ring_producer.cuh"
#include "gpu_side/cuda/ring_push.hpp"

namespace proxyep::gpu_side::cuda {

namespace {

constexpr int kThreads = 256;

// One block: thread i publishes descriptors i, i + kThreads, ... at base + i, ...; positions need
// no atomic (this stream is the ring's only producer and runs its pushes one after another).
__global__ void ring_push_kernel(DeviceRing ring, RingPushCounters* counters,
                                 const Descriptor* descriptors, int64_t count,
                                 uint64_t timeout_ns) {
  const uint64_t base = counters->head;  // written by the previous push, a kernel before this one
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
    (void)device_push_at(ring, descriptors[i], base + static_cast<uint64_t>(i), timeout_ns);
  __syncthreads();
  if (threadIdx.x != 0) return;
  counters->head = base + static_cast<uint64_t>(count);
  // Every slot of the batch is published (the threads' release stores of seq, ordered before
  // the barrier): the header's head may count them. release (system scope): pairs with the
  // acquire load of reserved() by quiet() (proxy/engine/ring_lane.hpp).
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(ring.header->producer.head)
      .store(base + static_cast<uint64_t>(count), ::cuda::memory_order_release);
}

}  // namespace

cudaError_t launch_ring_push(RingHeader* header, uint64_t capacity, RingPushCounters* counters,
                             const Descriptor* descriptors, int64_t count, uint64_t timeout_ns,
                             cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const DeviceRing ring{header, ring_slots(header), capacity, &counters->head,
                        &counters->cached_tail};
  const int threads = count < kThreads ? static_cast<int>(count) : kThreads;
  PROXYEP_LAUNCH(ring_push_kernel, 1, threads, 0, stream)
  (ring, counters, descriptors, count, timeout_ns);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
