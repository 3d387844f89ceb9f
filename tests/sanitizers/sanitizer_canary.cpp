// One deliberate bug per mode, run as the ranks of `proxyep launch` by the sanitizer.* tests of a
// sanitizer build. Each test expects the sanitizer's report in the launcher's output and the
// launch to fail, which shows that the runtime defaults (runtime_defaults.cpp: LeakSanitizer on,
// UBSan's stack traces) hold in every rank and that a report in a rank fails the test.
// Usage: sanitizer_canary heap-overflow | leak | signed-overflow | race
#include <atomic>
#include <climits>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

namespace {

int* volatile g_sink = nullptr;  // keeps the compiler from removing the allocation
volatile int g_shared = 0;       // written by two threads without synchronisation

int heap_overflow() {
  std::vector<int> values(4, 1);
  volatile size_t index = values.size();
  return values.data()[index];
}

int leak() {
  g_sink = new int[16];
  g_sink = nullptr;
  return 0;
}

int signed_overflow() {
  volatile int value = INT_MAX;
  // Stored, not compared: GCC folds `value + 1 > 0` to `value > -1` before UBSan sees the add.
  volatile int sum = value + 1;
  return sum > 0 ? 0 : 1;
}

// Both threads write g_shared in lock-step rounds, each round after the other thread's write of
// the round before, and neither thread ends before the last round: the report does not depend on
// how one write of each is timed against the other thread's start or end (one write per thread
// went unreported in one CI run). The round counter is relaxed: it orders nothing for
// ThreadSanitizer, so the writes stay unsynchronised.
int race() {
  constexpr int kRounds = 64;
  std::atomic<int> arrivals{0};
  const auto write_in_rounds = [&arrivals] {
    for (int round = 1; round <= kRounds; ++round) {
      g_shared = g_shared + 1;
      arrivals.fetch_add(1, std::memory_order_relaxed);
      while (arrivals.load(std::memory_order_relaxed) < 2 * round)
        std::this_thread::yield();
    }
  };
  std::thread other(write_in_rounds);
  write_in_rounds();
  other.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc == 2 ? argv[1] : "";
  if (mode == "heap-overflow") return heap_overflow();
  if (mode == "leak") return leak();
  if (mode == "signed-overflow") return signed_overflow();
  if (mode == "race") return race();
  std::fprintf(stderr, "usage: sanitizer_canary heap-overflow | leak | signed-overflow | race\n");
  return 2;
}
