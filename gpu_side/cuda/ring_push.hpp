// The stream-ordered descriptor push of CudaDevice::ring_push (device/device_runtime.hpp): one
// kernel that publishes a batch of descriptors at consecutive positions of a ring in mapped
// pinned host memory, after the kernels queued before it on the stream.
#pragma once

#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring_layout.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proxyep::gpu_side::cuda {

// The device's producer state of one ring, in device memory: the next position to take and the
// cached copy of the consumer's tail (ring_producer.cuh's DeviceRing::head / cached_tail).
struct RingPushCounters {
  uint64_t head;
  uint64_t cached_tail;
};

// Pushes descriptors[0, count) (device-reachable) at positions counters->head onwards, in order;
// then advances counters->head and publishes it as the header's producer head (what quiet()
// counts). `header`: the ring's header as the device addresses it (registered, mapped).
cudaError_t launch_ring_push(RingHeader* header, uint64_t capacity, RingPushCounters* counters,
                             const Descriptor* descriptors, int64_t count, uint64_t timeout_ns,
                             cudaStream_t stream);

}  // namespace proxyep::gpu_side::cuda
