// Stream capture (DeviceRuntime::begin_capture / end_capture / launch) on any DeviceRuntime: run
// on the host-simulated device by test_simulated_device_capture.cpp and on CUDA by
// tests/gpu/test_gpu_signal.cpp. Each case returns "" when it held, else what went wrong.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::testing::device_capture {

using device_ring::kWait;
using device_signal::error_of;
using device_signal::SignalPage;

// Whether all of `bytes` at `p` hold `value`.
inline bool all_bytes(const std::byte* p, uint64_t bytes, uint8_t value) {
  for (uint64_t i = 0; i < bytes; ++i)
    if (p[i] != std::byte{value}) return false;
  return true;
}

// A captured graph that moves `input` (registered host memory) into the page's payload and then
// writes `done` into its done word: nothing ran before its first launch, and each launch, with
// new input bytes written first, carries them.
inline std::string graph_carries_inputs(device::DeviceRuntime& device,
                                        const device::DeviceGraph& graph, SignalPage& page,
                                        std::byte* input, uint64_t done,
                                        std::initializer_list<uint8_t> values) {
  constexpr uint64_t kBytes = SignalPage::kPayload;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  if (page.load(page.done()) != 0 || !all_bytes(page.payload(), kBytes, 0))
    return "a captured operation ran before the graph was launched";
  for (const uint8_t value : values) {
    std::memset(input, value, kBytes);
    std::atomic_ref<uint64_t>(*page.done()).store(0, std::memory_order_release);
    device.launch(graph, "test launch");
    const std::string error = error_of([&] { device.synchronize("after the launch", kWait); });
    if (!error.empty()) return fmt::format("launch {:#x}: {}", value, error);
    if (page.load(page.done()) != done) return fmt::format("launch {:#x}: no done word", value);
    if (!all_bytes(page.payload(), kBytes, value))
      return fmt::format("launch {:#x}: the payload is not the input's bytes", value);
  }
  return "";
}

// A step captured once and launched twice: nothing runs while it is captured; each launch waits
// for the gate word, moves the input (registered host memory, rewritten by the host between
// launches) through device memory allocated and dropped inside the capture, and signals the done
// word after the payload landed. The second launch reads what the input holds then: the graph
// keeps addresses, not bytes.
inline std::string capture_and_replay_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  constexpr uint64_t kBytes = SignalPage::kPayload;
  SignalPage page(*device);
  std::byte* input = page.payload() + 1024;  // inside the registered page, past the payload
  std::memset(input, 0x11, kBytes);
  device->begin_capture("test capture");
  if (!device->capturing()) return "capturing() says no after begin_capture";
  device->wait_value(page.gate(), 1, kWait, "test gate");
  {
    // Dropped before the capture ends: the graph's copy of it must stay valid for every launch.
    const std::shared_ptr<std::byte[]> staged = device->allocate(kBytes);
    device->copy(staged.get(), input, kBytes);
    device->copy(page.payload(), staged.get(), kBytes);
  }
  device->write_value(page.done(), 7, "test done");
  std::unique_ptr<device::DeviceGraph> graph = device->end_capture("test capture");
  if (device->capturing()) return "capturing() says yes after end_capture";
  std::atomic_ref<uint64_t>(*page.gate()).store(1, std::memory_order_release);
  return graph_carries_inputs(*device, *graph, page, input, 7, {0x11, 0x22});
}

// What a graph cannot hold, refused at once, naming the capture; the capture is then invalid
// (end_capture says why) and the stream runs as queued again. Events recorded inside a capture
// are points in the graph: no host waits for them. Nesting and unmatched calls are refused.
inline std::string refused_in_capture_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  SignalPage page(*device);
  std::vector<std::byte> plain(64);
  const std::shared_ptr<std::byte[]> on_device = device->allocate(64);
  struct Attempt {
    const char* name;
    std::function<void()> call;
    const char* wanted;
  };
  const std::shared_ptr<device::DeviceEvent> before = device->record();
  const Attempt attempts[] = {
      {"synchronize", [&] { device->synchronize("sync in capture", kWait); },
       "synchronize: the host waits for the stream"},
      {"wait_for", [&] { device->wait_for(*before, "wait in capture", kWait); },
       "wait_for: the host waits for an event of the stream"},
      {"reached", [&] { (void)device->reached(*before, "query in capture"); },
       "reached: the host asks whether the stream reached an event"},
      {"read-back", [&] { device->copy(plain.data(), on_device.get(), plain.size()); },
       "copy: 64 bytes into plain host memory"},
      {"join", [&] { device->wait_event(before, kWait); },
       "wait_event: an event recorded outside the capture joins the stream"},
  };
  for (const Attempt& attempt : attempts) {
    device->begin_capture(attempt.name);
    const std::string error = error_of(attempt.call);
    const std::string wanted =
        fmt::format("{}, inside the capture begun by {}", attempt.wanted, attempt.name);
    if (error.find(wanted) == std::string::npos)
      return fmt::format("{} in a capture said \"{}\", without \"{}\"", attempt.name, error,
                         wanted);
    const std::string ended = error_of([&] { (void)device->end_capture("end"); });
    if (ended.find("the capture is invalid: " + std::string(attempt.wanted)) == std::string::npos)
      return fmt::format("end_capture after {} said \"{}\"", attempt.name, ended);
    if (device->capturing()) return fmt::format("still capturing after {}", attempt.name);
  }

  // A captured event; nesting, a launch inside, an end without a begin.
  device->begin_capture("outer");
  const std::shared_ptr<device::DeviceEvent> inside = device->record();
  device->write_value(page.done(), 3, "inside");
  const std::string nested = error_of([&] { device->begin_capture("inner"); });
  std::unique_ptr<device::DeviceGraph> graph = device->end_capture("outer");
  if (nested.find("already being captured (by outer)") == std::string::npos)
    return fmt::format("a nested begin_capture said \"{}\"", nested);
  if (!inside->captured() || before->captured())
    return "captured() does not tell an event recorded inside the capture";
  const std::string waited = error_of([&] { device->wait_for(*inside, "captured", kWait); });
  if (waited.find("recorded inside a capture") == std::string::npos)
    return fmt::format("a host wait for a captured event said \"{}\"", waited);
  const std::string unmatched = error_of([&] { (void)device->end_capture("unmatched"); });
  if (unmatched.find("not being captured") == std::string::npos)
    return fmt::format("an unmatched end_capture said \"{}\"", unmatched);
  device->begin_capture("holding a launch");
  const std::string launched = error_of([&] { device->launch(*graph, "launch inside"); });
  (void)device->end_capture("holding a launch");
  if (launched.find("being captured") == std::string::npos)
    return fmt::format("a launch inside a capture said \"{}\"", launched);

  // The stream works as before, the refusals queued nothing, and the graph still launches.
  if (page.load(page.done()) != 0) return "a captured write ran without a launch";
  device->launch(*graph, "after the refusals");
  device->copy(plain.data(), on_device.get(), plain.size());
  const std::string error = error_of([&] { device->synchronize("after the refusals", kWait); });
  if (!error.empty()) return fmt::format("the stream is unusable after the refusals: {}", error);
  return page.load(page.done()) == 3 ? "" : "the graph's write did not land";
}

// A stream joining another's capture (a fork and its join: how a Buffer's stream joins the
// capture torch.cuda.graph makes of the caller's stream): the caller's stream begins the capture
// and records a point; the worker stream waits for it (and so captures too), moves the input
// through device memory into the payload and records its end; the caller's stream waits for
// that (joined back) and signals done. One graph of both streams' work, launched twice on the
// caller's stream with new input between, carries each input. Refused: ending the capture on
// the joined stream; ending it with the worker not joined back (the capture is invalid); a
// point of an ended capture. The worker then runs what it is given, uncaptured.
inline std::string joined_capture_case(const std::shared_ptr<device::DeviceRuntime>& caller) {
  constexpr uint64_t kBytes = SignalPage::kPayload;
  const std::shared_ptr<device::DeviceRuntime> worker = caller->open_stream();
  SignalPage page(*caller);
  std::byte* input = page.payload() + 1024;  // inside the registered page, past the payload
  const std::shared_ptr<std::byte[]> staged = caller->allocate(kBytes);
  caller->begin_capture("caller capture");
  const std::shared_ptr<device::DeviceEvent> fork = caller->record();
  worker->wait_event(fork, kWait);
  if (!worker->capturing()) return "the stream that waited for a captured point is not capturing";
  const std::string ended_there = error_of([&] { (void)worker->end_capture("worker end"); });
  if (ended_there.find("joined a capture begun on another stream") == std::string::npos)
    return fmt::format("end_capture on the joined stream said \"{}\"", ended_there);
  worker->copy(staged.get(), input, kBytes);
  worker->copy(page.payload(), staged.get(), kBytes);
  caller->wait_event(worker->record(), kWait);
  caller->write_value(page.done(), 5, "joined done");
  const std::unique_ptr<device::DeviceGraph> graph = caller->end_capture("caller capture");
  if (worker->capturing()) return "the joined stream still captures after end_capture";
  const std::string carried = graph_carries_inputs(*caller, *graph, page, input, 5, {0x33, 0x44});
  if (!carried.empty()) return carried;

  caller->begin_capture("unjoined");
  worker->wait_event(caller->record(), kWait);
  worker->fill(staged.get(), 0, kBytes);
  const std::string unjoined = error_of([&] { (void)caller->end_capture("unjoined"); });
  if (unjoined.find("the capture is invalid") == std::string::npos)
    return fmt::format("end_capture with a stream not joined back said \"{}\"", unjoined);
  if (worker->capturing() || caller->capturing()) return "still capturing after the failed end";
  const std::string stale = error_of([&] { worker->wait_event(fork, kWait); });
  if (stale.find("a capture that has ended") == std::string::npos)
    return fmt::format("waiting for a point of an ended capture said \"{}\"", stale);
  worker->fill(staged.get(), 1, kBytes);
  const std::string error = error_of([&] { worker->synchronize("after the refusals", kWait); });
  return error.empty() ? "" : fmt::format("the worker is unusable after the refusals: {}", error);
}

// Two streams, each with a captured step of one handshake, launched kRounds times each with no
// host in between: the producer adds 1 to a device counter and copies it into the slot, the
// consumer adds the slot into its sum. Their waits and signals take their values from epoch
// words the graphs advance themselves (SignalValue{epoch, offset}), so replay n waits for the
// other side's replay n (or n - 1) and signals n: the sum is 1 + 2 + ... + kRounds exactly once
// each. With the values fixed at capture, every replay after the first would find the first
// one's words and run ahead. An epoch word the device cannot use is refused, naming it.
inline std::string replayed_handshake_case(const std::shared_ptr<device::DeviceRuntime>& producer) {
  constexpr uint64_t kRounds = 6;
  const std::shared_ptr<device::DeviceRuntime> consumer = producer->open_stream();
  SignalPage page(*producer);
  uint64_t* ready = page.gate();  // producer -> consumer: step n is in the slot
  uint64_t* read = page.done();   // consumer -> producer: step n was read
  // Device words: the two epochs, the counter, one, the slot, the sum.
  const std::shared_ptr<std::byte[]> memory = producer->allocate(64);
  auto* words = reinterpret_cast<uint64_t*>(memory.get());
  uint64_t *const producer_epoch = words, *const consumer_epoch = words + 1,
                  *const counter = words + 2, *const one = words + 3, *const slot = words + 4,
                  *const sum = words + 5;
  const uint64_t initial[6] = {0, 0, 0, 1, 0, 0};
  std::memcpy(page.payload(), initial, sizeof initial);
  producer->copy(words, page.payload(), sizeof initial);
  producer->synchronize("test setup", kWait);

  const std::string refused = error_of([&] {
    uint64_t plain = 0;
    producer->wait_value(ready, {&plain, 0}, kWait, "plain epoch");
  });
  if (refused.find("its epoch word") == std::string::npos)
    return fmt::format("an epoch word in plain host memory was not refused: \"{}\"", refused);

  producer->begin_capture("producer step");
  producer->add_value(producer_epoch, 1, "producer epoch");
  producer->wait_value(read, {producer_epoch, -1}, kWait, "the consumer read the last step");
  queue_kernel(*producer, &device::EpKernels::add,
               {.wide = true, .to = counter, .from = one, .count = 1});
  producer->copy(slot, counter, 8);
  producer->write_value(ready, {producer_epoch, 0}, "the step is in the slot");
  const std::unique_ptr<device::DeviceGraph> produce = producer->end_capture("producer step");
  consumer->begin_capture("consumer step");
  consumer->add_value(consumer_epoch, 1, "consumer epoch");
  consumer->wait_value(ready, {consumer_epoch, 0}, kWait, "the step is in the slot");
  queue_kernel(*consumer, &device::EpKernels::add,
               {.wide = true, .to = sum, .from = slot, .count = 1});
  consumer->write_value(read, {consumer_epoch, 0}, "the step was read");
  const std::unique_ptr<device::DeviceGraph> consume = consumer->end_capture("consumer step");

  // The consumer's replays first: each must wait for its producer step, not run ahead.
  for (uint64_t round = 0; round < kRounds; ++round)
    consumer->launch(*consume, "consumer replay");
  for (uint64_t round = 0; round < kRounds; ++round)
    producer->launch(*produce, "producer replay");
  const std::string error = error_of([&] {
    producer->synchronize("producer replays", kWait);
    consumer->synchronize("consumer replays", kWait);
    producer->copy(page.payload(), words, sizeof initial);
    producer->synchronize("read back", kWait);
  });
  if (!error.empty()) return fmt::format("the replays failed: {}", error);
  uint64_t seen[6];
  std::memcpy(seen, page.payload(), sizeof seen);
  const uint64_t wanted_sum = kRounds * (kRounds + 1) / 2;
  if (seen[5] != wanted_sum || seen[2] != kRounds || seen[0] != kRounds || seen[1] != kRounds ||
      page.load(ready) != kRounds || page.load(read) != kRounds)
    return fmt::format(
        "after {} replays: sum {} (wanted {}), counter {}, epochs {} and {}, ready {}, read {}",
        kRounds, seen[5], wanted_sum, seen[2], seen[0], seen[1], page.load(ready), page.load(read));
  return "";
}

}  // namespace proxyep::gpu_side::testing::device_capture
