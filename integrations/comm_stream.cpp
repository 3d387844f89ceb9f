// CommStream (comm_stream.hpp).
#include "integrations/comm_stream.hpp"

#include "common/log.hpp"

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
}

std::function<void()> CommStream::settler() const {
  return [alive = std::weak_ptr<CommStream*>(alive_)] {
    if (auto stream = alive.lock()) (*stream)->settle();
  };
}

CallEvent CommStream::event_for(std::shared_ptr<StealableTask> task) const {
  return CallEvent([settle = settler(), task = std::move(task)] {
    settle();
    task->run_or_wait();
  });
}

}  // namespace proxyep::integrations
