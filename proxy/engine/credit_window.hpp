// Credit windows: how much one proxy thread may have in flight towards each destination rank,
// counted in writes and in bytes. Network flow control lives here, on the CPU, not in the rings
// (DESIGN.md: a ring slot is freed as soon as its descriptor is copied out). A write that finds
// its destination's window full is not posted: the proxy keeps it in its backlog and retries it
// after local completions returned credits.
//
// Threading: none. Each proxy thread owns its windows; acquire() and release() run on that
// thread only (acquire when posting, release when the local completion is retired).
//
// A single write larger than the byte budget is admitted when nothing else is in flight to that
// destination: refusing it would block the destination forever, and letting it through alone
// still bounds the bytes in flight by max(budget, largest write).
#pragma once

#include "common/error.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::proxy {

struct CreditLimits {
  uint32_t writes = 64;         // writes in flight per destination
  uint64_t bytes = 8ull << 20;  // bytes in flight per destination
};

class CreditWindow {
 public:
  explicit CreditWindow(CreditLimits limits = {}) : limits_(limits) {
    require(limits.writes > 0 && limits.bytes > 0, "proxy.credits",
            "credit limits must be positive (writes {}, bytes {})", limits.writes, limits.bytes);
  }

  // Takes one write of `bytes` out of the window; Status::again when it does not fit now.
  [[nodiscard]] Status acquire(uint64_t bytes) {
    if (writes_ >= limits_.writes) return Status::again;
    if (writes_ > 0 && bytes_ + bytes > limits_.bytes) return Status::again;
    ++writes_;
    bytes_ += bytes;
    return Status::ok;
  }

  // Gives back what one acquire(bytes) took. Returning more than is in flight is a bug in the
  // caller's bookkeeping; it is clamped (never wraps) so the window cannot grow past its limits.
  void release(uint64_t bytes) {
    if (writes_ > 0) --writes_;
    bytes_ = bytes > bytes_ ? 0 : bytes_ - bytes;
  }

  uint32_t writes_in_flight() const { return writes_; }
  uint64_t bytes_in_flight() const { return bytes_; }
  bool idle() const { return writes_ == 0; }
  const CreditLimits& limits() const { return limits_; }

 private:
  CreditLimits limits_;
  uint32_t writes_ = 0;
  uint64_t bytes_ = 0;
};

// One window per destination rank.
class CreditWindows {
 public:
  CreditWindows(int ranks, CreditLimits limits)
      : windows_(static_cast<size_t>(ranks), CreditWindow(limits)) {}

  [[nodiscard]] Status acquire(int rank, uint64_t bytes) { return at(rank).acquire(bytes); }
  void release(int rank, uint64_t bytes) { at(rank).release(bytes); }
  CreditWindow& at(int rank) { return windows_[static_cast<size_t>(rank)]; }
  const CreditWindow& at(int rank) const { return windows_[static_cast<size_t>(rank)]; }
  int ranks() const { return static_cast<int>(windows_.size()); }

  uint64_t writes_in_flight() const {
    uint64_t total = 0;
    for (const auto& window : windows_)
      total += window.writes_in_flight();
    return total;
  }

 private:
  std::vector<CreditWindow> windows_;
};

}  // namespace proxyep::proxy
