// Sleeping without losing a wake-up: the doorbell (an eventfd) and the consumer's wait policy.
//
// Proxies must be cheap when idle (DESIGN.md): a consumer spins briefly, yields a little, then
// blocks on an eventfd. Producers must not pay a syscall per descriptor, so they write the
// eventfd only on the empty-to-non-empty edge, and only when the consumer said it sleeps:
//   consumer: consumer_sleeping = 1 (seq_cst); if head == position (seq_cst load: the ring is
//             empty and nothing is reserved) block on the eventfd, else withdraw the flag;
//   producer: head.fetch_add (seq_cst) ... publish ... if consumer_sleeping (seq_cst load) and
//             this producer wins the exchange 1 -> 0, write the eventfd.
// Both sides store then load under seq_cst (Dekker), so at least one sees the other: either the
// consumer sees the reservation and stays awake, or the producer sees the flag and kicks. The
// exchange lets one producer kick per sleep. A kick that arrives after the consumer woke up for
// another reason stays counted in the eventfd and only makes the next sleep return early.
//
// A GPU producer cannot write an eventfd. Its consumer uses a RingWaiter without a doorbell,
// which polls with short timed sleeps (WaitPolicy::timed_sleep) instead of blocking.
//
// Cross-process: the eventfd travels with the ring's memfd (fd passing); Doorbell::adopt wraps
// a received descriptor.
#pragma once

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "gpu_side/ring.hpp"

#include <chrono>
#include <cstdint>

namespace proxyep::gpu_side {

class Doorbell {
 public:
  // A new non-blocking, close-on-exec eventfd. Throws proxyep::Error on failure.
  Doorbell();
  // Takes ownership of an eventfd received from another process (or duplicated).
  static Doorbell adopt(int fd);
  ~Doorbell();
  Doorbell(Doorbell&& other) noexcept;
  Doorbell& operator=(Doorbell&& other) noexcept;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Wakes the waiter (or makes its next wait return at once). Async-signal-safe; never fails
  // in a way the producer could act on, so it reports nothing.
  void kick() const noexcept;
  // Blocks until kicked or `timeout` passes; consumes pending kicks. True when kicked.
  bool wait(std::chrono::nanoseconds timeout) const noexcept;
  int fd() const { return fd_; }

 private:
  explicit Doorbell(int fd) : fd_(fd) {}
  int fd_ = -1;
};

struct WaitPolicy {
  uint32_t spins = 2048;  // busy polls of the next slot first (a handoff at cache-miss latency)
  uint32_t yields = 16;   // then polls between sched_yield()s
  // Longest single block on the doorbell. The doorbell needs no timeout to be correct; this
  // bounds the wait for a producer that died between reserving and publishing.
  std::chrono::microseconds max_block{10000};
  // Without a doorbell (GPU producers), the sleep between polls.
  std::chrono::microseconds timed_sleep{20};
};

// The consumer's side of the protocol: spin, yield, then sleep on the doorbell.
class RingWaiter {
 public:
  // `doorbell` may be null: then only timed sleeps (the GPU-producer case).
  RingWaiter(RingConsumer& consumer, const Doorbell* doorbell, WaitPolicy policy = {});

  // Returns ok once consumer.ready(), timeout when `deadline` passes first.
  Status wait(const Deadline& deadline);
  // Times the waiter blocked on the doorbell (metrics, tests).
  uint64_t blocks() const { return blocks_; }

 private:
  void sleep_once(const Deadline& deadline);

  RingConsumer& consumer_;
  const Doorbell* doorbell_;
  WaitPolicy policy_;
  uint64_t blocks_ = 0;
};

}  // namespace proxyep::gpu_side
