// PhaseClock: splits one call's time into the phases of PhaseTimes (buffer.hpp) with one clock
// read per boundary: lap(&PhaseTimes::pack_ns) charges the time since the previous boundary to
// packing. A call that pauses (an async call between its caller's part and the communication
// thread's) resumes with resume(), which charges the pause to nothing. completed() counts the call.
#pragma once

#include "integrations/normal_types.hpp"

#include <chrono>
#include <cstdint>

namespace proxyep::integrations {

class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes& times) : times_(times), last_(now()) {}

  void lap(uint64_t PhaseTimes::*phase) {
    const uint64_t t = now();
    times_.*phase += t - last_;
    last_ = t;
  }
  void resume() { last_ = now(); }
  // The call completed (one that failed is not counted, though its phases are).
  void completed() { ++times_.calls; }

 private:
  static uint64_t now() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }

  PhaseTimes& times_;
  uint64_t last_;
};

}  // namespace proxyep::integrations
