// QuietTracker: an exact quiet (flush) for writes that complete out of order. Every write gets a
// ticket when posted (0, 1, 2, ... from one posting thread); completions retire tickets in any
// order (from any thread); a shadow in-order retirement index -- NCCL GIN's cisShadow, here
// control/sequence_window.hpp's PrefixWindow -- advances over contiguous completed tickets.
// quiet(target) holds once every ticket below `target` completed, so "every write posted before
// this call has completed" is wait(posted(), ...), however the completions were reordered.
// Cursors, NCCL net.cc style: posted() >= retired_prefix(), and posted() - retired_prefix() <=
// capacity (post() returns Status::again when the ring of in-flight tickets is full).
//
// Atomics and their partners:
// - posted_: release store by the poster pairs with complete()'s acquire load (a completion for
//   an unposted ticket is an error) and with quiet waiters reading posted().
// - the retirement window: see PrefixWindow (seq_cst bit CAS / tail CAS; tail() is an acquire
//   load, so a waiter that sees a ticket retired also sees what its completer had seen).
#pragma once

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/error_note.hpp"
#include "control/sequence_window.hpp"

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace proxyep::control {

class QuietTracker {
 public:
  using Ticket = uint64_t;

  // capacity: tickets in flight at most, a power of two; throws proxyep::Error otherwise.
  explicit QuietTracker(uint64_t capacity);

  // Issues the next ticket (posting thread only); Status::again when `capacity` are in flight.
  [[nodiscard]] Status post(Ticket& ticket);
  // Ticket `ticket` completed (any thread). Status::error for one never posted or completed
  // twice; last_error() says which.
  [[nodiscard]] Status complete(Ticket ticket);

  uint64_t posted() const { return posted_.load(std::memory_order_acquire); }
  // Every ticket below this has completed.
  uint64_t retired_prefix() const { return window_.tail(); }
  bool quiet(uint64_t target) const { return retired_prefix() >= target; }
  // Tickets below `target` that have not completed (exact; scans the window).
  uint64_t outstanding(uint64_t target) const;
  uint64_t capacity() const { return window_.capacity(); }
  std::string last_error() const { return error_.last(); }

  // Waits until quiet(target), calling `progress` between checks (it returns Status or void;
  // anything but ok/again ends the wait). Throws proxyep::Error(phase, ...) on timeout, naming
  // how many writes are still outstanding and the oldest, or when progress fails.
  template <typename Progress>
  void wait(uint64_t target, std::string_view phase, const Deadline& deadline,
            Progress&& progress) const;
  // wait(posted(), ...): every write posted before this call has completed.
  template <typename Progress>
  void wait_all(std::string_view phase, const Deadline& deadline, Progress&& progress) const {
    wait(posted(), phase, deadline, std::forward<Progress>(progress));
  }

 private:
  [[noreturn]] void fail_timeout(uint64_t target, std::string_view phase) const;

  PrefixWindow window_;
  alignas(64) std::atomic<uint64_t> posted_{0};
  ErrorNote error_;
};

template <typename Progress>
void QuietTracker::wait(uint64_t target, std::string_view phase, const Deadline& deadline,
                        Progress&& progress) const {
  while (!quiet(target)) {
    if (deadline.expired()) fail_timeout(target, phase);
    if constexpr (std::is_void_v<std::invoke_result_t<Progress&>>) {
      progress();
    } else {
      Status status = progress();
      if (status != Status::ok && status != Status::again)
        fail(std::string(phase), "progress failed ({}) while waiting for {} writes to complete",
             to_string(status), outstanding(target));
    }
  }
}

}  // namespace proxyep::control
