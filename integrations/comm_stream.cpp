// CommStream (comm_stream.hpp).
#include "integrations/comm_stream.hpp"

#include "common/log.hpp"
#include "common/params.hpp"

#include <exception>

namespace proxyep::integrations {

CommStream::~CommStream() {
  try {
    settle();
  } catch (const std::exception& e) {
    log::warn("buffer: a call finishing in the background failed: {}", e.what());
  }
}

std::shared_ptr<StealableTask> CommStream::submit(std::function<void()> body) {
  auto task = std::make_shared<StealableTask>(std::move(body));
  pending_.push_back(task);
  worker_.submit(task);
  return task;
}

void CommStream::settle() {
  auto pending = std::move(pending_);
  pending_.clear();
  std::exception_ptr first;
  for (auto& task : pending) {
    try {
      task->run_or_wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  // Before the next call: a device point that ran out of time (device_completion.hpp).
  if (completion_ != nullptr) completion_->check("async_finish");
}

std::function<void()> CommStream::settler() const {
  return [alive = std::weak_ptr<CommStream*>(alive_)] {
    if (auto stream = alive.lock()) (*stream)->settle();
  };
}

void CommStream::attach_device(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  // ep.async_wait = host: no device points (their spin may stall the call's own kernels where
  // streams share a hardware queue); the caller waits for the call on the host.
  if (params::ep_async_wait.get() != "device") return;
  completion_ = std::make_unique<DeviceCompletion>(std::move(device));
}

CallEvent CommStream::submit_call(std::function<void()> body, bool on_device,
                                  std::string_view phase) {
  if (!on_device || completion_ == nullptr) return event_for(submit(std::move(body)));
  DeviceCompletion::Point point = completion_->next(phase);
  // The word is raised however the task ends: a failure is the host event's to report.
  auto task = submit([body = std::move(body), completion = completion_.get(), n = point.number] {
    struct Reach {
      DeviceCompletion* completion;
      uint64_t number;
      ~Reach() { completion->reach(number); }
    } reach{completion, n};
    body();
  });
  const CallEvent host = event_for(std::move(task));
  return CallEvent([host] { host.wait(); }, std::move(point.event));
}

CallEvent CommStream::event_for(std::shared_ptr<StealableTask> task) const {
  return CallEvent([settle = settler(), task = std::move(task)] {
    settle();
    task->run_or_wait();
  });
}

}  // namespace proxyep::integrations
