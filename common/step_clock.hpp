// Where the time of a multi-step setup goes: each mark() closes a step and records the wall time
// and this process's CPU time since the previous mark (or since construction). A Buffer's
// creation marks its steps (landing region, options agreed, node memory, fabric, addresses,
// registration, proxy, ready), so a slow start at 128+ ranks names the step that grew instead of
// one total; the CPU time tells a step that works (it grows with the ranks on a host's cores)
// from one that waits for the others.
#pragma once

#include <chrono>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

namespace proxyep {

class StepClock {
 public:
  struct Step {
    std::string name;
    double seconds = 0;      // wall time
    double cpu_seconds = 0;  // CPU time of the whole process (all its threads) meanwhile
  };
  using Steps = std::vector<Step>;

  // Closes `step`: the time since the previous mark is its.
  void mark(std::string step) {
    const auto now = std::chrono::steady_clock::now();
    const double cpu = process_cpu_seconds();
    steps_.push_back(
        {std::move(step), std::chrono::duration<double>(now - last_).count(), cpu - last_cpu_});
    last_ = now;
    last_cpu_ = cpu;
  }
  const Steps& steps() const { return steps_; }

 private:
  static double process_cpu_seconds() {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }

  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  double last_cpu_ = process_cpu_seconds();
  Steps steps_;
};

// Marks `clock` when it is given (steps of a setup that may be timed or not).
inline void mark_step(StepClock* clock, std::string step) {
  if (clock) clock->mark(std::move(step));
}

}  // namespace proxyep
