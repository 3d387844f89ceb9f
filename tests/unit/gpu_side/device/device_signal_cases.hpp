// Signal words on a device's stream (DeviceRuntime::wait_value / write_value) on any
// DeviceRuntime: run on the host-simulated device by test_simulated_device.cpp and on CUDA by
// tests/gpu/test_gpu_signal.cpp. Each case returns "" when it held, else what went wrong.
#pragma once

#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "tests/unit/gpu_side/device/device_ring_cases.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::testing::device_signal {

using device_ring::kWait;
using device_ring::Registered;

// One page of registered host memory: the gate word the host raises, the done word the stream
// writes, and a payload the stream fills before it signals.
struct SignalPage {
  static constexpr uint64_t kPayload = 256;
  explicit SignalPage(device::DeviceRuntime& device)
      : memory(HostMemory::heap(4096)), registered(device, memory.bytes()) {}
  uint64_t* words() { return reinterpret_cast<uint64_t*>(memory.bytes().data()); }
  uint64_t* gate() { return words(); }
  uint64_t* done() { return words() + 1; }
  std::byte* payload() { return memory.bytes().data() + 64; }
  uint64_t load(uint64_t* word) {
    return std::atomic_ref<uint64_t>(*word).load(std::memory_order_acquire);
  }
  HostMemory memory;
  Registered registered;
};

inline std::string error_of(auto&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// wait_value holds back the operations behind it while the gate is below the value (also
// when it is close: 2 of 3), lets them run once the host raises it; write_value then publishes
// the done word only after the copy before it is visible: a host thread that acquires the word
// finds the whole payload. The wait adds the time it took to its waited_ns: the host held the
// gate 30 ms after the stream reached the wait (checked against 5 ms: a loaded machine may
// start the wait late).
inline std::string wait_then_signal_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  SignalPage page(*device);
  const std::shared_ptr<std::byte[]> source = device->allocate(SignalPage::kPayload);
  const std::shared_ptr<std::byte[]> waited_memory = device->allocate(sizeof(int64_t));
  auto* waited_ns = reinterpret_cast<int64_t*>(waited_memory.get());
  device->fill(source.get(), 0x5a, SignalPage::kPayload);
  device->fill(waited_memory.get(), 0, sizeof(int64_t));
  const std::shared_ptr<device::DeviceEvent> at_wait = device->record();
  device->wait_value(page.gate(), 3, kWait, "test gate", waited_ns);
  device->copy(page.payload(), source.get(), SignalPage::kPayload);
  std::byte* waited_on_host = page.payload() + 1024;
  device->copy(waited_on_host, waited_memory.get(), sizeof(int64_t));
  device->write_value(page.done(), 7, "test done");
  const std::shared_ptr<device::DeviceEvent> end = device->record();

  std::string failure;
  std::atomic_ref<uint64_t>(*page.gate()).store(2, std::memory_order_release);
  device->wait_for(*at_wait, "test: the stream reached the wait", kWait);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  if (page.load(page.done()) != 0 || device->reached(*end, "test"))
    failure = "the operations behind wait_value ran while the word was short of the value";
  // The host side of a proxy: acquire the done word, then read what it publishes.
  std::string seen;
  std::thread reader([&] {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (page.load(page.done()) != 7) {
      if (std::chrono::steady_clock::now() > deadline) {
        seen = "the done word was never written";
        return;
      }
      std::this_thread::yield();
    }
    for (uint64_t i = 0; i < SignalPage::kPayload; ++i)
      if (page.payload()[i] != std::byte{0x5a}) {
        seen = fmt::format("the done word was visible before payload byte {}", i);
        return;
      }
  });
  std::atomic_ref<uint64_t>(*page.gate()).fetch_add(1, std::memory_order_release);
  const std::string waited = error_of([&] { device->wait_for(*end, "after the gate", kWait); });
  reader.join();
  if (failure.empty()) failure = waited.empty() ? seen : waited;
  int64_t ns = 0;
  std::memcpy(&ns, waited_on_host, sizeof ns);
  if (failure.empty() && ns < 5'000'000)
    failure = fmt::format("the wait's waited_ns says {} ns; the host held the gate 30 ms", ns);
  return failure;
}

// A word nobody raises: the wait gives up at its deadline instead of hanging the stream, the
// write behind it does not signal, and every later host wait reports the wait (sticky), naming
// its phase, what the word held and what was awaited.
inline std::string timed_out_wait_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  SignalPage page(*device);
  device->wait_value(page.gate(), 1, std::chrono::milliseconds(100),
                     "low_latency_dispatch(receive)");
  device->write_value(page.done(), 9, "test done");
  for (const char* phase : {"after the wait", "again"}) {
    const std::string error = error_of([&] { device->synchronize(phase, kWait); });
    for (const std::string& part :
         {std::string(phase), std::string("wait_value (low_latency_dispatch(receive))"),
          std::string("holds 0, not 1, after 100 ms")})
      if (error.find(part) == std::string::npos)
        return fmt::format("synchronize() said \"{}\", without \"{}\"", error, part);
  }
  if (page.load(page.done()) != 0) return "the write behind a failed wait signalled";
  return "";
}

// Words the device cannot use are refused before anything is queued, naming the phase; the
// stream stays usable.
inline std::string refused_words_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  std::vector<uint64_t> plain(4);
  SignalPage page(*device);
  const auto* misaligned = reinterpret_cast<uint64_t*>(page.memory.bytes().data() + 4);
  const struct {
    std::string error, wanted;
  } refusals[] = {
      {error_of([&] { device->wait_value(plain.data(), 1, kWait, "plain wait"); }),
       "plain wait: wait_value: the signal word at"},
      {error_of([&] { device->write_value(plain.data() + 1, 1, "plain write"); }),
       "is neither device memory nor registered host memory"},
      {error_of([&] { device->wait_value(misaligned, 1, kWait, "misaligned"); }),
       "misaligned: wait_value: the signal word at"},
      {error_of([&] { device->write_value(const_cast<uint64_t*>(misaligned), 1, "misaligned"); }),
       "is not 8-byte aligned"},
      {error_of([&] {
         device->wait_value(page.gate(), 1, kWait, "plain waited_ns",
                            reinterpret_cast<int64_t*>(plain.data() + 2));
       }),
       "plain waited_ns: wait_value (its waited_ns): the signal word at"},
  };
  for (const auto& refusal : refusals)
    if (refusal.error.find(refusal.wanted) == std::string::npos)
      return fmt::format("refused with \"{}\", without \"{}\"", refusal.error, refusal.wanted);
  device->write_value(page.done(), 1, "after the refusals");
  const std::string error = error_of([&] { device->synchronize("after the refusals", kWait); });
  if (!error.empty()) return fmt::format("the stream is unusable after refusals: {}", error);
  return page.load(page.done()) == 1 ? "" : "the write after the refusals did not land";
}

}  // namespace proxyep::gpu_side::testing::device_signal
