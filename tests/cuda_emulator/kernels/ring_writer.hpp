// A test kernel of the emulator's ring tests (test_emu_ring_proxy.cpp): many threads of several
// blocks push descriptors into one ring concurrently with device_push()
// (gpu_side/cuda/ring_producer.cuh), each taking its positions from the shared head, as a
// dispatch kernel's warps would. Compiled like gpu_side/cuda's kernels (the shim and the
// detector's instrumentation), so every slot store is held to the publication rules.
#pragma once

#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring_layout.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proxyep::cuemu_testing {

struct RingWriterArgs {
  gpu_side::RingHeader* header;  // the ring, in mapped host memory
  uint64_t capacity;
  uint64_t* head;         // the reservation counter (device memory or &header->producer.head)
  uint64_t* cached_tail;  // device memory, zeroed
  const gpu_side::Descriptor* descriptors;  // device-reachable, `count` of them
  int64_t count;
  uint64_t timeout_ns;          // any one wait for a free slot
  unsigned long long* gave_up;  // device memory: threads whose push failed
};

// blocks x threads: thread t of the grid pushes descriptors t, t + blocks * threads, ...
cudaError_t launch_ring_writer(const RingWriterArgs& args, unsigned blocks, unsigned threads,
                               cudaStream_t stream);

}  // namespace proxyep::cuemu_testing
