// The stream-side signal words (gpu_side/cuda/stream_signal.hpp) on the emulator, on two
// emulated streams: a wait is released by a write queued on the other stream, by adds, by a host
// store and by an epoch value read when it runs; a wait that times out claims its stream's
// WaitFault (first failure only, with what it saw) and the stream's later writes, adds and waits
// then do nothing. The words and the faults live in mapped host memory, as the device runtime
// keeps them, so the detector holds every store to the publication rules.
#include "common/deadline.hpp"
#include "gpu_side/cuda/stream_signal.hpp"

#include "tests/cuda_emulator/emu_support.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

using namespace proxyep;
using namespace proxyep::cuemu_testing;
using namespace std::chrono_literals;
namespace gpu = proxyep::gpu_side::cuda;
using proxyep::gpu_side::device::SignalValue;

namespace {

constexpr uint64_t kLongNs = 20'000'000'000;  // a wait that must be released, never time out
constexpr auto kStillWaiting = 50ms;          // how long a wait is seen to hold its stream

struct Words {
  uint64_t word[16];
};

bool report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  return ok;
}

uint64_t load(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_acquire);
}

// True when `stream` still has work queued after a while (its wait holds it).
bool held(cudaStream_t stream) {
  std::this_thread::sleep_for(kStillWaiting);
  return cudaStreamQuery(stream) == cudaErrorNotReady;
}

class Fixture {
 public:
  Fixture() : words_memory_(sizeof(Words)), faults_memory_(2 * sizeof(gpu::WaitFault)) {}

  uint64_t* word(int i) { return &words_memory_.as<Words>().word[i]; }
  gpu::WaitFault* fault(int stream) { return &faults_memory_.as<gpu::WaitFault>() + stream; }
  cudaStream_t stream(int i) const { return i == 0 ? first_ : second_; }

 private:
  MappedMemory words_memory_;
  MappedMemory faults_memory_;
  Stream first_, second_;
};

// Stream 0 waits for word 0 >= 1, then writes word 1 = 7; stream 1's write of word 0 releases it.
bool released_by_write(Fixture& f, int64_t* waited_ns) {
  check(gpu::launch_wait_value(f.word(0), 1, kLongNs, f.fault(0), 1, waited_ns, f.stream(0)),
        "wait_value");
  check(gpu::launch_write_value(f.word(1), 7, f.fault(0), f.stream(0)), "write_value");
  const bool was_held = held(f.stream(0)) && load(*f.word(1)) == 0;
  check(gpu::launch_write_value(f.word(0), 1, f.fault(1), f.stream(1)), "write_value");
  const bool settled = settle(f.stream(0), Deadline(10s)) && settle(f.stream(1), Deadline(10s));
  return report(was_held && settled && load(*f.word(1)) == 7 && f.fault(0)->wait == 0,
                "a wait held its stream until a write on the other stream released it");
}

// Stream 0 waits for word 2 >= 3; two adds on stream 1 leave it waiting, the third releases it.
bool released_by_adds(Fixture& f) {
  check(gpu::launch_wait_value(f.word(2), 3, kLongNs, f.fault(0), 2, nullptr, f.stream(0)),
        "wait_value");
  check(gpu::launch_add_value(f.word(3), 1, f.fault(0), f.stream(0)), "add_value");
  for (int i = 0; i < 2; ++i)
    check(gpu::launch_add_value(f.word(2), 1, f.fault(1), f.stream(1)), "add_value");
  const bool two_settled = settle(f.stream(1), Deadline(10s));
  const bool was_held = held(f.stream(0)) && load(*f.word(2)) == 2 && load(*f.word(3)) == 0;
  check(gpu::launch_add_value(f.word(2), 1, f.fault(1), f.stream(1)), "add_value");
  const bool settled = settle(f.stream(0), Deadline(10s)) && settle(f.stream(1), Deadline(10s));
  return report(
      two_settled && was_held && settled && load(*f.word(2)) == 3 && load(*f.word(3)) == 1,
      "a wait for 3 held through two adds and passed on the third");
}

// Stream 1 waits for word 4 >= 5, which the host stores (as a proxy thread would).
bool released_by_host(Fixture& f) {
  check(gpu::launch_wait_value(f.word(4), 5, kLongNs, f.fault(1), 3, nullptr, f.stream(1)),
        "wait_value");
  check(gpu::launch_write_value(f.word(5), 11, f.fault(1), f.stream(1)), "write_value");
  const bool was_held = held(f.stream(1)) && load(*f.word(5)) == 0;
  std::atomic_ref<uint64_t>(*f.word(4)).store(4, std::memory_order_release);  // not yet
  const bool still_held = held(f.stream(1));
  std::atomic_ref<uint64_t>(*f.word(4)).store(5, std::memory_order_release);
  const bool settled = settle(f.stream(1), Deadline(10s));
  return report(was_held && still_held && settled && load(*f.word(5)) == 11,
                "a wait passed once the host stored the value, not before");
}

// An epoch value is read when the operation runs: stream 0 advances word 6 (the epoch) to 1 and
// then waits for word 7 >= epoch + 1 = 2, which a host store provides; its write of word 8 =
// epoch * 10 carries the epoch of that moment.
bool epoch_values(Fixture& f) {
  check(gpu::launch_add_value(f.word(6), 1, f.fault(0), f.stream(0)), "add_value(epoch)");
  check(gpu::launch_wait_value(f.word(7), SignalValue(f.word(6), 1), kLongNs, f.fault(0), 4,
                               nullptr, f.stream(0)),
        "wait_value(epoch)");
  check(gpu::launch_write_value(f.word(8), SignalValue(f.word(6), 0, 10), f.fault(0), f.stream(0)),
        "write_value(epoch)");
  std::atomic_ref<uint64_t>(*f.word(7)).store(1, std::memory_order_release);
  const bool was_held = held(f.stream(0)) && load(*f.word(8)) == 0;
  std::atomic_ref<uint64_t>(*f.word(7)).store(2, std::memory_order_release);
  const bool settled = settle(f.stream(0), Deadline(10s));
  return report(was_held && settled && load(*f.word(6)) == 1 && load(*f.word(8)) == 10,
                "epoch values are taken when the operations run");
}

// A wait that times out claims the stream's fault with what it saw; the stream's later writes,
// adds and waits do nothing (a second failing wait neither waits nor overwrites the fault);
// the other stream, with its own fault, goes on.
bool timed_out(Fixture& f) {
  gpu::WaitFault& fault = *f.fault(0);
  std::atomic_ref<uint64_t>(*f.word(9)).store(2, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  check(gpu::launch_wait_value(f.word(9), 3, 30'000'000, f.fault(0), 42, nullptr, f.stream(0)),
        "wait_value(times out)");
  check(gpu::launch_write_value(f.word(10), 9, f.fault(0), f.stream(0)), "write_value");
  check(gpu::launch_add_value(f.word(11), 1, f.fault(0), f.stream(0)), "add_value");
  check(gpu::launch_wait_value(f.word(12), 1, kLongNs, f.fault(0), 43, nullptr, f.stream(0)),
        "wait_value(after the failure)");
  check(gpu::launch_write_value(f.word(13), 5, f.fault(1), f.stream(1)), "write_value(other)");
  const bool settled = settle(f.stream(0), Deadline(10s)) && settle(f.stream(1), Deadline(10s));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char text[240];
  std::snprintf(text, sizeof(text),
                "a wait timed out after 30 ms: fault {wait %llu, word %s, expected %llu, seen "
                "%llu}, later operations skipped, the other stream went on (%.2f s)",
                static_cast<unsigned long long>(fault.wait),
                fault.word == reinterpret_cast<uint64_t>(f.word(9)) ? "ok" : "WRONG",
                static_cast<unsigned long long>(fault.expected),
                static_cast<unsigned long long>(fault.seen), seconds);
  return report(settled && seconds < 5 && fault.wait == 42 &&
                    fault.word == reinterpret_cast<uint64_t>(f.word(9)) && fault.expected == 3 &&
                    fault.seen == 2 && load(*f.word(10)) == 0 && load(*f.word(11)) == 0 &&
                    load(*f.word(13)) == 5 && f.fault(1)->wait == 0,
                text);
}

}  // namespace

int main() {
  return proxyep::cuemu_testing::run_program([] {
    Fixture fixture;
    DeviceArray<int64_t> waited(1);
    const auto case_start = std::chrono::steady_clock::now();
    bool ok = released_by_write(fixture, waited.get());
    const auto case_ns = std::chrono::nanoseconds(std::chrono::steady_clock::now() - case_start);
    int64_t waited_ns = 0;
    check(cudaMemcpy(&waited_ns, waited.get(), sizeof(waited_ns), cudaMemcpyDeviceToHost),
          "cudaMemcpy(waited)");
    // Some of the time the host held the wait, no more than the case took: the kernel's clock
    // starts when the stream's worker gets to it, which a loaded machine delays.
    ok &= report(waited_ns > 0 && waited_ns <= case_ns.count(),
                 "waited_ns counts the released wait (" + std::to_string(waited_ns) + " ns of " +
                     std::to_string(case_ns.count()) + ")");
    ok &= released_by_adds(fixture);
    ok &= released_by_host(fixture);
    ok &= epoch_values(fixture);
    ok &= timed_out(fixture);
    return ok;
  });
}
