// DeviceCompletion: device-side points for work that ends on the host's CommStream (an
// async_finish call with device tensors), so that a caller's GPU stream waits for such a call
// without any host thread blocking, as DeepEP's EventOverlap::current_stream_wait() does. Only
// with ep.async_wait = device (CommStream::attach_device): on a GPU the point's spinning kernel
// and the event behind it hold up their hardware queue, and where the Buffer's stream shares it
// (CUDA_DEVICE_MAX_CONNECTIONS=1) the call's later kernels wait behind the spin until the
// call's deadline; by default the caller waits for the call on the host.
//
// A CUDA event marks only work already queued, and an async call's last device work is queued
// later, by the CommStream's thread. So each point is a wait on a stream of its own (the
// Buffer's stream is not held up): at the call, that stream queues wait_value(word >= n) on a
// word in registered host memory and records an event after it; the call's task raises the word
// to n when it ends, after its device work was waited for, so whatever waits for the event reads
// the call's outputs complete. The word is raised for a task that failed too: the failure is
// the host event's (rethrown at the next Buffer call or wait), and no GPU stream is held for it.
// The device wait's own deadline (several ep_timeout_ms: longer than any task's deadlines,
// which fail and raise it first) is a backstop only; it fails the completion stream, which
// check() (the start of the Buffer's next call) reports and replaces.
//
// Threads: next() and check() belong to the Buffer's calling thread; reach() may run on any thread
// (CommStream tasks run on its thread or are stolen by the caller).
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/device/device_runtime.hpp"

#include <cstdint>
#include <memory>
#include <string_view>

namespace proxyep::integrations {

class DeviceCompletion {
 public:
  // Opens a stream of `device` (DeviceRuntime::open_stream) and registers the word's page.
  explicit DeviceCompletion(std::shared_ptr<gpu_side::device::DeviceRuntime> device);
  // Raises the word to the last point (nothing waits for a task that will not run), drains the
  // stream (failures are logged) and unregisters the page.
  ~DeviceCompletion();
  DeviceCompletion(const DeviceCompletion&) = delete;
  DeviceCompletion& operator=(const DeviceCompletion&) = delete;

  struct Point {
    uint64_t number = 0;  // what reach() must be given
    std::shared_ptr<gpu_side::device::DeviceEvent> event;
  };
  // The point of the next task: its event is reached once reach(number) ran.
  Point next(std::string_view phase);
  // Throws proxyep::Error(phase) once when a point's wait ran out of time (then the stream is
  // replaced, and later points work again).
  void check(std::string_view phase);
  // The word becomes at least `number` (release): the points up to it are reached.
  void reach(uint64_t number);

 private:
  void open();
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::shared_ptr<gpu_side::device::DeviceRuntime> stream_;
  HostMemory page_;
  uint64_t* word_;                  // the host's address of the word
  const uint64_t* word_on_device_;  // the device's
  uint64_t issued_ = 0;             // points handed out
  std::shared_ptr<gpu_side::device::DeviceEvent> last_;
};

}  // namespace proxyep::integrations
