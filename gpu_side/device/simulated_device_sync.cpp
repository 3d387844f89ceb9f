// SimulatedDevice's events, signal words and synchronize (simulated_device.hpp): how the host and
// other streams wait for a stream, and a stream for a word in memory.
#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/device/simulated_device_core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace proxyep::gpu_side::device {

namespace {

constexpr std::string_view kPhase = kSimulatedPhase;

const SimulatedDevice::Event& recorded_on(const DeviceEvent& event,
                                          const SimulatedDevice::Core* stream,
                                          std::string_view phase) {
  const auto* simulated = dynamic_cast<const SimulatedDevice::Event*>(&event);
  require(simulated != nullptr && simulated->stream == stream, phase,
          "the host waits only for an event this stream recorded");
  require(!simulated->in_capture, phase,
          "the event was recorded inside a capture: a point in a graph, which the host cannot "
          "wait for");
  return *simulated;
}

// A signal word the stream may use: 8-byte aligned (what the CUDA kernels' 64-bit atomics need)
// and reachable by the device. Checked before anything is queued.
void require_signal_word(const SimulatedDevice::Core& core, std::string_view op,
                         const uint64_t* word, std::string_view phase) {
  require(reinterpret_cast<uintptr_t>(word) % alignof(uint64_t) == 0, phase,
          "{}: the signal word at {} is not 8-byte aligned", op, static_cast<const void*>(word));
  require(core.reachable(word, sizeof(uint64_t)), phase,
          "{}: the signal word at {} is neither device memory nor registered host memory", op,
          static_cast<const void*>(word));
}

void require_epoch_word(const SimulatedDevice::Core& core, std::string_view op,
                        const SignalValue& value, std::string_view phase) {
  if (value.epoch != nullptr)
    require_signal_word(core, fmt::format("{} (its epoch word)", op), value.epoch, phase);
}

// The value an operation of the stream's thread compares or stores, the epoch word read now.
uint64_t resolve(const SignalValue& value) {
  if (value.epoch == nullptr) return value.offset;
  return value.at(std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(value.epoch))
                      .load(std::memory_order_acquire));
}

}  // namespace

std::shared_ptr<DeviceEvent> SimulatedDevice::record() {
  auto event = std::make_shared<Event>();
  event->device = core_->memory.get();
  event->stream = core_.get();
  // Reached even after a failure (a waiting host then reports the failure at once, not at its
  // deadline).
  const Core::Queued queued = core_->enqueue(
      "record",
      [event] {
        {
          std::lock_guard lock(event->mutex);
          event->reached = true;
        }
        event->changed.notify_all();
      },
      true);
  event->in_capture = queued.capture != nullptr;
  event->capture = queued.capture;
  event->stream_ops = queued.stream_ops;
  return event;
}

bool SimulatedDevice::reached(const DeviceEvent& event, std::string_view phase) {
  const Event& recorded = recorded_on(event, core_.get(), phase);
  {
    std::lock_guard lock(core_->mutex);
    core_->refuse_in_capture("reached: the host asks whether the stream reached an event", phase);
  }
  bool is_reached = false;
  {
    std::lock_guard lock(recorded.mutex);
    is_reached = recorded.reached;
  }
  std::lock_guard lock(core_->mutex);
  core_->require_healthy(phase);
  return is_reached;
}

void SimulatedDevice::wait_for(const DeviceEvent& event, std::string_view phase,
                               std::chrono::milliseconds timeout) {
  const Event& recorded = recorded_on(event, core_.get(), phase);
  {
    std::lock_guard lock(core_->mutex);
    core_->refuse_in_capture("wait_for: the host waits for an event of the stream", phase);
    core_->flush();
  }
  bool is_reached = false;
  {
    std::unique_lock lock(recorded.mutex);
    is_reached = recorded.changed.wait_for(lock, timeout, [&] { return recorded.reached; });
  }
  std::lock_guard lock(core_->mutex);
  core_->require_healthy(phase);
  if (!is_reached)
    fail(std::string(phase),
         "the simulated device's stream has not reached the event after {} ms ({} operations "
         "queued)",
         timeout.count(), core_->queue.size());
}

// The stream waits for a point inside a capture: it joins that capture (what it queues from now
// on is recorded into the same graph, after that point), or, already in it, is ordered after
// that point, which the order the capture records in gives already (simulated_device_core.hpp);
// the capturing stream waiting for a joined stream's point joins that stream back.
void SimulatedDevice::join_capture(const Event& event) {
  const std::shared_ptr<Core::Capture> capture = event.capture.lock();
  std::lock_guard lock(core_->mutex);
  bool ended = capture == nullptr;
  if (capture != nullptr) {
    std::lock_guard recording(capture->mutex);
    ended = capture->ended;
  }
  require(!ended, kPhase,
          "wait_event: the event was recorded inside a capture that has ended: a point in a "
          "graph, which a stream outside it cannot wait for");
  if (core_->capture == capture) {
    std::lock_guard recording(capture->mutex);
    Core::Capture::Joined* joined = capture->joined_stream(event.stream);
    if (capture->origin == core_.get() && joined != nullptr)
      joined->joined_back = std::max(joined->joined_back, event.stream_ops);
    return;
  }
  if (core_->capture != nullptr)
    core_->refuse_in_capture(
        fmt::format("wait_event: an event of the capture begun by {} joins the stream",
                    capture->phase),
        kPhase);
  core_->require_healthy(kPhase);
  std::lock_guard recording(capture->mutex);
  capture->joined.push_back({.stream = core_});
  core_->capture = capture;
}

void SimulatedDevice::wait_event(const std::shared_ptr<DeviceEvent>& event,
                                 std::chrono::milliseconds timeout) {
  auto simulated = std::dynamic_pointer_cast<Event>(event);
  require(simulated != nullptr && simulated->device == core_->memory.get(), kPhase,
          "wait_event: the event was not recorded on a stream of this device");
  if (simulated->in_capture) return join_capture(*simulated);
  {
    std::lock_guard lock(core_->mutex);
    core_->refuse_in_capture("wait_event: an event recorded outside the capture joins the stream",
                             kPhase);
  }
  core_->enqueue("wait_event", [simulated, timeout] {
    std::unique_lock lock(simulated->mutex);
    require(simulated->changed.wait_for(lock, timeout, [&] { return simulated->reached; }), kPhase,
            "wait_event: the event was not reached within {} ms", timeout.count());
  });
}

void SimulatedDevice::wait_value(const uint64_t* word, SignalValue value,
                                 std::chrono::milliseconds timeout, std::string_view phase,
                                 int64_t* waited_ns) {
  require_signal_word(*core_, "wait_value", word, phase);
  require_epoch_word(*core_, "wait_value", value, phase);
  if (waited_ns != nullptr)
    require_signal_word(*core_, "wait_value (its waited_ns)",
                        reinterpret_cast<const uint64_t*>(waited_ns), phase);
  core_->enqueue("wait_value", [word, value, timeout, waited_ns, phase = std::string(phase)] {
    const auto start = std::chrono::steady_clock::now();
    const uint64_t awaited = resolve(value);
    // The word's writers are other threads (proxies, the host, a peer's stream): an atomic read.
    std::atomic_ref<uint64_t> signal(*const_cast<uint64_t*>(word));
    const Deadline deadline(timeout);
    Backoff backoff;
    for (uint32_t polls = 0; signal.load(std::memory_order_acquire) < awaited; ++polls) {
      if (deadline.expired())
        fail(std::string(kPhase),
             "wait_value ({}): the signal word at {} holds {}, not {}{}, after {} ms", phase,
             static_cast<const void*>(word), signal.load(std::memory_order_acquire), awaited,
             value.epoch != nullptr
                 ? fmt::format(
                       " (the epoch word at {}{} plus {})", static_cast<const void*>(value.epoch),
                       value.times != 1 ? fmt::format(" times {}", value.times) : std::string(),
                       static_cast<int64_t>(value.offset))
                 : std::string(),
             timeout.count());
      if (polls < 1000)
        backoff.pause();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (waited_ns != nullptr)
      *waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  });
}

void SimulatedDevice::write_value(uint64_t* word, SignalValue value, std::string_view phase) {
  require_signal_word(*core_, "write_value", word, phase);
  require_epoch_word(*core_, "write_value", value, phase);
  core_->enqueue("write_value", [word, value] {
    // release: what the operations before it wrote is visible to whoever acquires the word.
    std::atomic_ref<uint64_t>(*word).store(resolve(value), std::memory_order_release);
  });
}

void SimulatedDevice::add_value(uint64_t* word, uint64_t delta, std::string_view phase) {
  require_signal_word(*core_, "add_value", word, phase);
  core_->enqueue("add_value", [word, delta] {
    std::atomic_ref<uint64_t>(*word).fetch_add(delta, std::memory_order_release);
  });
}

void SimulatedDevice::synchronize(std::string_view phase, std::chrono::milliseconds timeout) {
  // As cudaStreamSynchronize: the work queued before the call, not what other threads queue
  // while it waits.
  std::unique_lock lock(core_->mutex);
  core_->refuse_in_capture("synchronize: the host waits for the stream", phase);
  const uint64_t until = core_->flush();
  const bool drained = core_->idle.wait_for(lock, timeout, [&] {
    // Work queued after `until` may keep the gate open (as another stream's would).
    return core_->finished >= until && (!core_->holding_gate || !core_->queue.empty());
  });
  if (!drained)
    fail(std::string(phase),
         "the simulated device's stream is still busy after {} ms ({} "
         "operations queued)",
         timeout.count(), core_->queue.size());
  core_->require_healthy(phase);
}

}  // namespace proxyep::gpu_side::device
