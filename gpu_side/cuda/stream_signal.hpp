// The stream-side signal words of CudaDevice::wait_value / write_value
// (device/device_runtime.hpp): one-thread kernels, so that they are stream-ordered and capturable
// like every other operation, with a deadline the GPU keeps itself (%globaltimer), since a word
// a dead peer never raises must not hang the stream.
#pragma once

#include "gpu_side/device/signal_value.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proxyep::gpu_side::cuda {

// The first wait of a stream that ran out of time, in mapped pinned host memory the host reads
// once the stream is past it. `wait` is 0 while none failed; else the failed wait's number (the
// host's table names its phase), and the other fields what it saw.
struct WaitFault {
  uint64_t wait;
  uint64_t word;      // the device address of the word
  uint64_t expected;  // the value awaited
  uint64_t seen;      // what the word held at the deadline
};

// Values with an epoch word (signal_value.hpp) read it when the kernel runs (acquire).

// Queues: wait until *word >= value, for at most timeout_ns; past it, claims `fault` (first
// failure only) and returns. A stream whose fault is already claimed does not wait again.
// `waited_ns` (may be null): += the nanoseconds waited (globaltimer), once the word held it.
cudaError_t launch_wait_value(const uint64_t* word, device::SignalValue value, uint64_t timeout_ns,
                              WaitFault* fault, uint64_t wait_number, int64_t* waited_ns,
                              cudaStream_t stream);

// Queues: *word = value (release, system scope), after the work queued before it; nothing when
// `fault` is claimed (what a failed wait let run is not signalled as done).
cudaError_t launch_write_value(uint64_t* word, device::SignalValue value, const WaitFault* fault,
                               cudaStream_t stream);

// Queues: *word += delta (release, system scope), after the work queued before it; nothing when
// `fault` is claimed (an epoch behind a failed wait does not advance).
cudaError_t launch_add_value(uint64_t* word, uint64_t delta, const WaitFault* fault,
                             cudaStream_t stream);

}  // namespace proxyep::gpu_side::cuda
