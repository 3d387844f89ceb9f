// CommStream: a Buffer's communication thread, the CPU analog of DeepEP's communication stream.
// Work a call leaves to finish in the background (an async_finish call's data movement, a
// receive hook's send phase) is queued here in call order and runs on one low-priority thread
// (common/background_worker.hpp). Every later Buffer call, every event wait and every hook first
// finishes what was queued before it (settle()), as GPU work runs after what was launched
// earlier on its stream; whoever settles runs a task itself if the thread has not started it, so
// waiting never costs more than doing the work.
//
// Threads: submit(), settle() and the events and settlers it hands out belong to the Buffer's
// calling thread (one thread per Buffer); the bodies run on the stream's thread or on that one,
// never two at once.
#pragma once

#include "common/background_worker.hpp"
#include "integrations/device_completion.hpp"
#include "integrations/low_latency_types.hpp"

#include <functional>
#include <memory>
#include <vector>

namespace proxyep::integrations {

class CommStream {
 public:
  CommStream() = default;
  // Settles; a failure is logged (nobody is left to receive it).
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `body` after everything queued before it.
  std::shared_ptr<StealableTask> submit(std::function<void()> body);
  // Finishes every queued task in order (here, or by waiting for the thread); rethrows the first
  // failure after all of them finished, else a device point's that ran out of time.
  void settle();
  // settle() as a function that outlives the stream (then it does nothing: the stream's
  // destructor already finished everything).
  std::function<void()> settler() const;
  // The event of `task`: waiting settles the stream, then rethrows `task`'s own failure.
  CallEvent event_for(std::shared_ptr<StealableTask> task) const;

  // Calls with device tensors get device points (DeviceCompletion) from now on, on `device`,
  // where ep.async_wait says device (read here, once per Buffer); else none: their events are
  // waited for on the host.
  void attach_device(std::shared_ptr<gpu_side::device::DeviceRuntime> device);
  // An async_finish call: queues `body` and returns its event, with a device point when
  // `on_device` (the call's tensors are on the attached device).
  CallEvent submit_call(std::function<void()> body, bool on_device, std::string_view phase);

 private:
  std::vector<std::shared_ptr<StealableTask>> pending_;
  std::shared_ptr<CommStream*> alive_ = std::make_shared<CommStream*>(this);
  std::unique_ptr<DeviceCompletion> completion_;  // tasks raise its word: outlives the worker
  BackgroundWorker worker_;  // last: its destructor may still run tasks that use the above
};

}  // namespace proxyep::integrations
