// Spin-then-yield backoff for waits on shared memory. Spinning keeps a handoff at cache-miss
// latency when both sides run; yielding keeps a waiter from burning the time slice of the thread
// it waits for when there are more runnable threads than cores (2 producers and a consumer on
// this 2-core machine). Long waits sleep elsewhere (gpu_side/ring.hpp RingWaiter, doorbell.hpp).
#pragma once

#include <cstdint>
#include <thread>

namespace proxyep {

// One iteration of a spin loop: tells the core to ease off (and a sibling hyperthread to run).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Backoff {
 public:
  explicit Backoff(uint32_t spins_before_yield = 128) : spins_before_yield_(spins_before_yield) {}

  void pause() {
    if (count_ < spins_before_yield_) {
      ++count_;
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  void reset() { count_ = 0; }

 private:
  uint32_t spins_before_yield_;
  uint32_t count_ = 0;
};

}  // namespace proxyep
