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
#include <thread>

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

// A survivor that has seen what it must see says so next to `stamp` and waits (up to `limit`)
// until all `survivors` have: one that exited at once would close its connections under the
// others while they are still noticing the death, and their failures would name it instead.
inline void wait_for_survivors(const std::string& stamp, int rank, int survivors,
                               std::chrono::milliseconds limit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(stamp).parent_path();
  const std::string prefix = fs::path(stamp).filename().string() + ".done.";
  std::ofstream(dir / (prefix + std::to_string(rank))).flush();
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int done = 0;
    for (const auto& entry : fs::directory_iterator(dir))
      done += entry.path().filename().string().starts_with(prefix) ? 1 : 0;
    if (done >= survivors) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace proxyep::testing
