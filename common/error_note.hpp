// ErrorNote: the latest error of an object whose hot path returns Status (docs/ERRORS.md). The
// failing call records what went wrong with note(), which returns Status::error so the call can
// `return error_.note(...)`; the object's last_error() reads it back with last().
//
// Threads: any thread may note() and last() at once; a mutex guards the message. It is taken on
// the error path only: a successful call never touches it. When several threads fail at once,
// last() holds one of their messages, whole.
#pragma once

#include "common/error.hpp"

#include <mutex>
#include <string>
#include <utility>

namespace proxyep {

class ErrorNote {
 public:
  [[nodiscard]] Status note(std::string message) {
    std::lock_guard lock(mutex_);
    message_ = std::move(message);
    return Status::error;
  }
  // The latest message; empty when nothing was noted.
  std::string last() const {
    std::lock_guard lock(mutex_);
    return message_;
  }

 private:
  mutable std::mutex mutex_;
  std::string message_;
};

}  // namespace proxyep
