// WaitNotifier: lets a thread waiting on the proxy engine (a flag, a quiet) sleep in the kernel
// instead of spinning, and be woken when a proxy thread may have made its condition true.
// Spinning waiters compete with the proxy threads they wait for whenever threads outnumber
// cores (two ranks with a waiter and a proxy each on a 2-core machine), which turns a
// microsecond hand-off into a scheduler time slice.
//
// Protocol (a Dekker pair; the waiter's condition is anything the proxies make true):
//   waiter:  sleepers_ += 1 (seq_cst); seen = generation_ (acquire); if the condition still
//            does not hold, futex-wait while generation_ == seen (bounded by a timeout);
//            sleepers_ -= 1.
//   proxy:   make conditions true (flag stores, retired cursors: release or seq_cst stores);
//            seq_cst fence; if sleepers_ > 0: generation_ += 1 (release) and futex-wake all.
// In the single seq_cst order either the proxy's fence precedes the waiter's increment, and the
// waiter's re-check sees the condition, or the proxy sees the sleeper and bumps the generation,
// so the waiter's futex-wait returns at once (value changed) or is woken. The timeout only bounds
// the cost of a bug or of a condition no proxy signals (e.g. a caller-defined predicate that
// another thread makes true).
//
// Atomics and their partners:
// - sleepers_: seq_cst RMWs by waiters pair with the proxies' seq_cst fence + relaxed load.
// - generation_: release RMW by the notifier pairs with the waiter's acquire load (and the
//   futex's own value check, done by the kernel under its lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace proxyep::proxy {

class WaitNotifier {
 public:
  // Proxy threads, after a pass that completed or routed anything. Cheap when nobody sleeps:
  // one fence and one load.
  void notify() noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the sleepers_ RMW
    if (sleepers_.load(std::memory_order_relaxed) == 0) return;
    generation_.fetch_add(1, std::memory_order_release);
    wake_all();
  }

  // Waiters: sleeps at most `timeout` unless `still_waiting()` turns false first (checked after
  // announcing the sleep, so a notify in between is never lost).
  template <typename StillWaiting>
  void sleep(std::chrono::microseconds timeout, StillWaiting&& still_waiting) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = generation_.load(std::memory_order_acquire);
    if (still_waiting()) wait_while(seen, timeout);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  void wake_all() noexcept;
  void wait_while(uint32_t seen, std::chrono::microseconds timeout) noexcept;

  alignas(64) std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
};

}  // namespace proxyep::proxy
