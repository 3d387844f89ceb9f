// DeviceRuntime: what a backend needs from a GPU, and nothing more, split by concern:
//   DeviceMemory   (device_memory.hpp)   device memory, memory a NIC or a node peer reaches, host
//                                        memory made visible to kernels
//   DeviceSignals  (device_signals.hpp)  descriptor rings and signal words the stream drives
//   DeviceCapture  (device_capture.hpp)  the stream recorded into a graph and replayed
//   DeviceRuntime  (here)                the stream itself: copies, fills, events, waits
//   EpKernels      (ep_kernels.hpp)      the EP kernels of both modes: a table each backend
//                                        fills, queued with queue_kernel()
// Every operation but synchronize() is queued on the runtime's one stream and runs after the
// ones queued before it, as on a CUDA stream; pointers it is given must stay valid until the
// next synchronize() returns.
//
// Two implementations share every line above this interface:
//   CudaDevice       (gpu_side/cuda/cuda_device.hpp)  the CUDA runtime and the kernels of
//                                                     gpu_side/cuda; built only with nvcc
//   SimulatedDevice  (simulated_device.hpp)           the host standing in for the GPU: separate
//                    allocations no other thread may touch, a worker thread for the stream, the
//                    kernels' CPU twins, and a check of every address an operation is given
// so what can be wrong in the wiring (which memory is passed where, what waits on what) is
// tested on every run, without a GPU.
//
// Errors. An operation with inconsistent parameters or an address the device cannot reach
// throws proxyep::Error(phase) at once, before anything is queued. A failure while the stream
// runs is sticky, as CUDA's are: synchronize() throws it, naming the operation.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_capture.hpp"
#include "gpu_side/device/device_memory.hpp"
#include "gpu_side/device/device_signals.hpp"
#include "gpu_side/device/ep_kernels.hpp"

#include <chrono>
#include <memory>
#include <string_view>
#include <type_traits>

namespace proxyep::gpu_side::device {

// A point in one stream's work (a cudaEvent_t), from DeviceRuntime::record(). Opaque: only a
// runtime of the same kind and device can wait for it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Recorded while its stream was being captured (begin_capture): a point inside a graph, not in
  // the stream's live work, so neither the host nor a stream outside the capture can wait for it.
  virtual bool captured() const { return false; }
};

class DeviceRuntime : public DeviceMemory, public DeviceSignals, public DeviceCapture {
 public:
  ~DeviceRuntime() override = default;

  // "cuda" or "simulated": for logs and errors.
  virtual std::string_view kind() const = 0;

  // Another stream of this device, as a second cudaStream_t: the same memory and kernels, its own
  // queue, ordered with this one only through events (record / wait_event). Throws
  // proxyep::Error when the device cannot make one.
  virtual std::shared_ptr<DeviceRuntime> open_stream() const = 0;

  // Stream-ordered operations. Addresses are device addresses: device memory or registered host
  // memory. copy() also takes plain host memory on either side, which it may read or write at
  // any time until the next synchronize() returns (CUDA may finish sooner; nothing relies on it).
  virtual void copy(void* to, const void* from, uint64_t bytes) = 0;
  virtual void fill(void* to, uint8_t value, uint64_t bytes) = 0;

  // The EP kernels (ep_kernels.hpp) and the runtime whose stream runs them: this one for a
  // backend; a runtime that wraps another hands out the other's. Use queue_kernel().
  virtual BoundKernels kernels() = 0;

  // Events order two streams of one device (the caller's compute stream and a Buffer's, as
  // DeepEP's previous_event does). record() marks the point after everything queued so far;
  // wait_event() makes this stream's later operations run after `event`'s point, which another
  // runtime on the same device recorded. The wait is queued, not performed: a point never
  // reached (a stream that stalled) fails this stream within `timeout` where the runtime can
  // bound it (the simulated device), else at synchronize()'s deadline (CUDA).
  virtual std::shared_ptr<DeviceEvent> record() = 0;
  virtual void wait_event(const std::shared_ptr<DeviceEvent>& event,
                          std::chrono::milliseconds timeout) = 0;

  // The host's side of an event this runtime recorded: reached() says, without blocking,
  // whether its stream has run everything queued before it (cudaEventQuery); wait_for() blocks
  // until it has, for at most `timeout`. Both throw proxyep::Error(phase) for a failed stream
  // (naming the operation), wait_for() also at the deadline. A backend publishes what its
  // kernels wrote (to the proxies, to a peer) only once their event is reached.
  virtual bool reached(const DeviceEvent& event, std::string_view phase) = 0;
  virtual void wait_for(const DeviceEvent& event, std::string_view phase,
                        std::chrono::milliseconds timeout) = 0;

  // Waits until everything queued has run, for at most `timeout`; throws proxyep::Error(phase)
  // for a failed operation (then the runtime is unusable, as a CUDA context is after a fault)
  // or a stream still busy at the deadline (then it may be called again).
  virtual void synchronize(std::string_view phase, std::chrono::milliseconds timeout) = 0;
};

// Queues `kernel` of `device`'s table on its stream:
//   queue_kernel(device, &EpKernels::combine, {.input = in, .num_tokens = tokens});
// Throws proxyep::Error at once for parameters the kernel refuses, before anything is queued.
template <typename Params>
void queue_kernel(DeviceRuntime& device, EpKernels::Kernel<Params> EpKernels::*kernel,
                  const std::type_identity_t<Params>& params) {
  const BoundKernels bound = device.kernels();
  (bound.table.*kernel)(bound.stream, params);
}

}  // namespace proxyep::gpu_side::device
