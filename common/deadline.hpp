// Every wait in ProxyEP has a deadline. Deadline wraps steady_clock so waits read as
// `while (!done) { if (deadline.expired()) fail(...); drive_progress(); }`.
#pragma once

#include <chrono>
#include <cstdint>

namespace proxyep {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Deadline(std::chrono::milliseconds timeout) : end_(Clock::now() + timeout) {}
  static Deadline after_ms(int64_t ms) { return Deadline(std::chrono::milliseconds(ms)); }

  bool expired() const { return Clock::now() >= end_; }
  std::chrono::milliseconds remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now());
    return left.count() > 0 ? left : std::chrono::milliseconds(0);
  }
  Clock::time_point end() const { return end_; }

 private:
  Clock::time_point end_;
};

}  // namespace proxyep
