// IdlePolicy: what a proxy thread does after a pass over its rings and rails found nothing to do.
// Proxies must be cheap when idle (DESIGN.md: busy-polling cores forever is what users complain
// of), yet fast when work arrives. So, counting consecutive empty passes:
//   1. spin:  the first `spin_passes` empty passes poll again at once (a burst is often followed
//             by more work within microseconds);
//   2. yield: the next `yield_passes` call sched_yield() between passes, letting the producer or
//             the consumer sharing this core run (this box has 2 cores for ranks and proxies);
//   3. sleep: then the thread sleeps until a producer kicks a ring's doorbell, the engine kicks it
//             (stop, a waiter arrived), or `sleep_us` passed. The timeout keeps the thread
//             polling its completion queues now and then: manual-progress providers (tcp;ofi_rxm,
//             shm, efa) move incoming writes only when the target reads its CQ, and the thread
//             also checks for peer timeouts and shutdown on each pass.
// Any pass that did work starts the count again. `keep_awake` caps the policy at the yield stage
// while someone waits on the engine (a flag, a quiet) or writes are in flight or waiting for
// credits: they depend on completions that only polling discovers, and a sleeping proxy would add
// up to `sleep_us` to their latency. `driven` (a waiting caller runs the passes itself,
// ProxyThread::try_drive()) sends an empty pass straight to sleep: polling beside the driver would
// only take the core it needs, and it kicks the thread when it stops driving.
//
// Threading: none; one instance per proxy thread, used by that thread only.
#pragma once

#include <cstdint>

namespace proxyep::proxy {

struct IdleOptions {
  uint32_t spin_passes = 64;     // empty passes polled back to back
  uint32_t yield_passes = 2000;  // then empty passes separated by sched_yield()
  uint32_t sleep_us = 5000;      // then sleep at most this long per pass (doorbells end it early)
};

class IdlePolicy {
 public:
  enum class Step { spin, yield, sleep };

  explicit IdlePolicy(IdleOptions options = {}) : options_(options) {}

  // Called after every pass; says what to do before the next one.
  Step after_pass(bool worked, bool keep_awake, bool driven = false) {
    if (worked) {
      empty_passes_ = 0;
      return Step::spin;
    }
    if (empty_passes_ < UINT32_MAX) ++empty_passes_;
    if (driven) return Step::sleep;
    if (empty_passes_ <= options_.spin_passes) return Step::spin;
    if (keep_awake || empty_passes_ - options_.spin_passes <= options_.yield_passes)
      return Step::yield;
    return Step::sleep;
  }

  uint32_t empty_passes() const { return empty_passes_; }
  const IdleOptions& options() const { return options_; }

 private:
  IdleOptions options_;
  uint32_t empty_passes_ = 0;
};

}  // namespace proxyep::proxy
