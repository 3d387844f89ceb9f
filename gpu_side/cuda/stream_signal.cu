// The stream-side signal words (stream_signal.hpp).
#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/stream_signal.hpp"

#include <cuda/atomic>

namespace proxyep::gpu_side::cuda {

namespace {

using SystemWord = ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>;

__device__ inline bool failed_before(const WaitFault* fault) {
  return SystemWord(const_cast<WaitFault*>(fault)->wait).load(::cuda::memory_order_relaxed) != 0;
}

// The value now: an epoch word is read as the kernel runs (acquire: the stream's own add_value
// or a peer's raise of it happened before).
__device__ inline uint64_t resolve(const device::SignalValue& value) {
  if (value.epoch == nullptr) return value.offset;
  return value.at(
      SystemWord(*const_cast<uint64_t*>(value.epoch)).load(::cuda::memory_order_acquire));
}

__global__ void wait_value_kernel(const uint64_t* word, device::SignalValue awaited,
                                  uint64_t timeout_ns, WaitFault* fault, uint64_t wait_number,
                                  int64_t* waited_ns) {
  SystemWord claimed(fault->wait);
  if (claimed.load(::cuda::memory_order_relaxed) != 0) return;  // the stream failed already
  const uint64_t value = resolve(awaited);
  // acquire (system scope): pairs with the writer's release store or fetch_add, so the
  // operations after this one read what the writer published before raising the word.
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system> signal(*const_cast<uint64_t*>(word));
  const uint64_t start = global_timer_ns();
  uint64_t seen;
  while ((seen = signal.load(::cuda::memory_order_acquire)) < value) {
    if (global_timer_ns() - start > timeout_ns) {
      uint64_t none = 0;
      if (claimed.compare_exchange_strong(none, wait_number, ::cuda::memory_order_relaxed)) {
        fault->word = reinterpret_cast<uint64_t>(word);
        fault->expected = value;
        fault->seen = seen;
        __threadfence_system();
      }
      return;
    }
    __nanosleep(1000);
  }
  // One thread, stream order: the stream's later operations see the sum (no atomic needed).
  if (waited_ns != nullptr) *waited_ns += static_cast<int64_t>(global_timer_ns() - start);
}

__global__ void write_value_kernel(uint64_t* word, device::SignalValue value,
                                   const WaitFault* fault) {
  // Behind a failed wait the work before this one ran on whatever was there: no signal of it.
  if (failed_before(fault)) return;
  // release (system scope): the earlier kernels' writes are complete (stream order); the fence
  // makes them visible to the host before the word is.
  __threadfence_system();
  SystemWord(*word).store(resolve(value), ::cuda::memory_order_release);
}

__global__ void add_value_kernel(uint64_t* word, uint64_t delta, const WaitFault* fault) {
  if (failed_before(fault)) return;
  __threadfence_system();
  SystemWord(*word).fetch_add(delta, ::cuda::memory_order_release);
}

}  // namespace

cudaError_t launch_wait_value(const uint64_t* word, device::SignalValue value, uint64_t timeout_ns,
                              WaitFault* fault, uint64_t wait_number, int64_t* waited_ns,
                              cudaStream_t stream) {
  PROXYEP_LAUNCH(wait_value_kernel, 1, 1, 0, stream)
  (word, value, timeout_ns, fault, wait_number, waited_ns);
  return cudaGetLastError();
}

cudaError_t launch_write_value(uint64_t* word, device::SignalValue value, const WaitFault* fault,
                               cudaStream_t stream) {
  PROXYEP_LAUNCH(write_value_kernel, 1, 1, 0, stream)(word, value, fault);
  return cudaGetLastError();
}

cudaError_t launch_add_value(uint64_t* word, uint64_t delta, const WaitFault* fault,
                             cudaStream_t stream) {
  PROXYEP_LAUNCH(add_value_kernel, 1, 1, 0, stream)(word, delta, fault);
  return cudaGetLastError();
}

}  // namespace proxyep::gpu_side::cuda
