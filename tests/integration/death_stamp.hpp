// Shared by the integration programs that kill a rank mid-run (--kill): the rank writes the
// moment it dies to a file (CLOCK_MONOTONIC nanoseconds, one clock for every process of the host)
// and dies by SIGKILL, so no exit path of its own runs; the survivors read the moment back to
// time how long they took to notice (issue 44: named and masked, or failed, within 2 s).
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace proxyep::testing {

inline double monotonic_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// Writes now to `stamp` (whole, by rename), says so on stderr, and dies by SIGKILL.
[[noreturn]] inline void die_by_sigkill(const std::string& stamp, const char* program) {
  if (!stamp.empty()) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
    const std::string partial = stamp + ".partial";
    std::ofstream(partial) << ns << "\n";
    std::filesystem::rename(partial, stamp);
  }
  std::fprintf(stderr, "%s: killing itself with SIGKILL (test)\n", program);
  ::raise(SIGKILL);
  ::_exit(1);  // not reached
}

// The moment in `stamp` as monotonic_seconds, or -1 when there is none (yet).
inline double death_seconds(const std::string& stamp) {
  int64_t ns = 0;
  std::ifstream(stamp) >> ns;
  return ns > 0 ? static_cast<double>(ns) * 1e-9 : -1;
}

}  // namespace proxyep::testing
