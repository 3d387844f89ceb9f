// The insides of SimulatedDevice (simulated_device.hpp) that its source files share: the memory
// its streams share, its events, and one stream's queue and worker. Not for use outside
// simulated_device*.cpp.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/capture_state.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "gpu_side/device/thread_access_key.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::device {

// What the simulated device's errors are raised under.
inline constexpr std::string_view kSimulatedPhase = "simulated device";

// One reachable range of a simulated device's memory.
struct SimulatedRange {
  uint64_t bytes = 0;
  bool device = false;   // device memory (else registered host memory)
  bool guarded = false;  // closed to the host (the NIC's view of device memory is not)
};

// What the streams of one simulated device share: its memory and what the device can reach.
//
// Device memory is closed to host code in one of two ways:
// - with protection keys (`key`), per thread: only the streams' workers may touch it, always;
// - without (`gated`), in time: its pages are PROT_NONE whenever none of the device's streams is
//   running operations, and opened (PROT_READ | PROT_WRITE, every guarded range) while one is.
//   A host thread that touches device memory faults unless it happens to do so while the device
//   is busy: after a synchronize, or between calls, it always faults.
struct SimulatedDevice::Memory {
  std::optional<ThreadAccessKey> key;
  bool gated = false;  // set once, before any memory or stream exists
  mutable std::mutex mutex;
  std::map<uintptr_t, SimulatedRange> ranges;  // reachable memory, by start address
  uint64_t device_bytes = 0;
  int running = 0;  // operations running on the device's streams (gated: the gate is open)
  // Guarded ranges freed (unreachable) but not yet unmapped: operations queued before the free
  // may still touch them, so the gate opens them too until the stream unmaps them.
  std::map<uintptr_t, uint64_t> retiring;

  // Adds a range of device memory (guarded: closed to the host), in the gate's current state.
  // Throws where the kernel refuses the protection. Locked by the caller.
  void add_device_range(void* start, uint64_t bytes, bool guarded) {
    if (guarded && gated) protect(start, bytes, running > 0);
    ranges[reinterpret_cast<uintptr_t>(start)] = {bytes, true, guarded};
    device_bytes += bytes;
  }

  // Makes the range at `start` unreachable; until forget_retired(start) the gate still opens it.
  // Locked by the caller.
  void retire(uintptr_t start) {
    const auto it = ranges.find(start);
    if (it == ranges.end()) return;
    if (it->second.guarded) retiring[start] = it->second.bytes;
    ranges.erase(it);
  }
  void forget_retired(uintptr_t start) { retiring.erase(start); }  // locked by the caller

  // A stream's worker around each spell of operations it runs (gated only).
  void enter_operation() {
    if (!gated) return;
    std::lock_guard lock(mutex);
    if (running++ == 0) protect_all(true);
  }
  void leave_operation() {
    if (!gated) return;
    std::lock_guard lock(mutex);
    if (--running == 0) protect_all(false);
  }

  // Whether [p, p + bytes) lies inside one reachable range. Locks.
  bool reachable(const void* p, uint64_t bytes) const {
    if (bytes == 0) return true;
    const auto address = reinterpret_cast<uintptr_t>(p);
    std::lock_guard lock(mutex);
    auto it = ranges.upper_bound(address);
    if (it == ranges.begin()) return false;
    --it;
    return address - it->first + bytes <= it->second.bytes;
  }

 private:
  static void protect(void* start, uint64_t bytes, bool open) {
    require(::mprotect(start, bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE) == 0,
            std::string(kSimulatedPhase), "mprotect of {} bytes of device memory at {}: {}", bytes,
            start, std::strerror(errno));
  }
  // Never throws (the workers call it): a range whose protection the kernel will not change
  // stays as it is, which fails loudly (an operation faults) or checks less (host reads pass).
  void protect_all(bool open) noexcept {
    const int protection = open ? PROT_READ | PROT_WRITE : PROT_NONE;
    for (const auto& [start, range] : ranges)
      if (range.guarded) (void)::mprotect(reinterpret_cast<void*>(start), range.bytes, protection);
    for (const auto& [start, bytes] : retiring)
      (void)::mprotect(reinterpret_cast<void*>(start), bytes, protection);
  }
};

// One stream: its queue and the worker thread that runs it.
struct SimulatedDevice::Core {
  struct Op {
    std::string name;
    std::function<void()> body;
    bool always = false;  // frees memory or marks an event: runs even after a failure
  };

  // A capture in progress (begin_capture .. end_capture): what is queued meanwhile, on the
  // stream that began it (its origin) and on every stream that joined it (wait_event for an
  // event recorded inside it), is recorded here instead of run, in the order the host queued
  // it. That order is one the graph may run in: each stream's operations stay in order, and an
  // event is recorded before any stream can wait for it. A graph runs its operations one after
  // another on the stream that launches it (CUDA may run the joined streams' branches side by
  // side; nothing correct depends on that).
  struct Capture : CaptureState {
    const Core* origin = nullptr;
    std::mutex mutex;  // the joined streams record from their callers' threads too
    std::vector<Op> ops;
    // Memory whose last owner went during the capture: the graph's operations may use it, so it
    // is released when the graph is gone (or at once when the capture ends invalid).
    std::vector<std::function<void()>> releases;
    // A stream that joined: how many operations it recorded, and how many of those precede an
    // event the origin waited for (joined back). end_capture needs every one joined back, as
    // CUDA's does (cudaErrorStreamCaptureUnjoined).
    struct Joined {
      std::shared_ptr<Core> stream;
      uint64_t recorded = 0;
      uint64_t joined_back = 0;
    };
    std::vector<Joined> joined;
    bool ended = false;

    Joined* joined_stream(const Core* stream) {
      for (Joined& j : joined)
        if (j.stream.get() == stream) return &j;
      return nullptr;
    }
  };

  SimulatedDeviceOptions options;
  std::shared_ptr<Memory> memory;

  mutable std::mutex mutex;
  std::condition_variable wake, idle;
  std::deque<Op> queue;
  // Operations are numbered in queue order: `queued` were queued, `finished` have run (or were
  // skipped after a failure). Deferred mode: the worker runs operation n only once n <
  // run_before, which a host wait raises to what was queued when it began (so work another
  // thread queues during the wait stays deferred, and the wait does not wait for it either).
  uint64_t queued = 0, finished = 0, run_before = 0;
  bool stopping = false, stopped = false;
  std::optional<std::string> failure;  // sticky, like a CUDA context's
  std::shared_ptr<Capture> capture;    // begun here, or joined
  uint64_t ops_run = 0;
  // Gated: this stream's worker holds the gate open (it ran an operation and has not closed it
  // yet). Locked. A synchronize that found the queue empty returns only once it is false, so
  // that a host read after it faults as on a GPU, not just after the worker gets round to it.
  bool holding_gate = false;
  uint64_t fail_candidates = 0;  // operations named options.fail_operation so far
  std::thread worker;

  bool reachable(const void* p, uint64_t bytes) const { return memory->reachable(p, bytes); }

  void require_reachable(std::string_view op, std::string_view what, const void* p,
                         uint64_t bytes) const {
    if (!reachable(p, bytes))
      fail(std::string(kSimulatedPhase),
           "{}: {} at {} ({} bytes) is neither device memory nor registered host memory", op, what,
           p, bytes);
  }

  // Where an operation went: the capture that recorded it (null: queued to run), and how many
  // of this stream's operations that capture holds with it (0 for the origin's).
  struct Queued {
    std::shared_ptr<Capture> capture;
    uint64_t stream_ops = 0;
  };

  Queued enqueue(std::string name, std::function<void()> body, bool always = false) {
    {
      std::lock_guard lock(mutex);
      if (capture) {
        std::lock_guard recording(capture->mutex);
        capture->ops.push_back({std::move(name), std::move(body), always});
        Capture::Joined* joined = capture->joined_stream(this);
        return {capture, joined != nullptr ? ++joined->recorded : 0};
      }
      queue.push_back({std::move(name), std::move(body), always});
      ++queued;
    }
    wake.notify_one();
    return {};
  }

  // Inside a capture, a call a graph cannot hold (`what`): invalidates the capture, so that
  // end_capture() fails naming it, and throws proxyep::Error(phase). Nothing outside one.
  // Locked.
  void refuse_in_capture(std::string_view what, std::string_view phase) {
    if (!capture) return;
    std::lock_guard recording(capture->mutex);
    capture->refuse(what, phase, "");
  }

  void run() {
    if (memory->key) memory->key->allow_this_thread();  // else the gate (Memory) opens
    // Gated: the gate stays open from the first operation of a busy spell to the moment the
    // stream has nothing it may run, not around each operation (each opening changes the
    // protection of every range: a spell of hundreds of small operations would crawl, and
    // change how the work interleaves with the proxies).
    bool open = false;
    std::unique_lock lock(mutex);
    auto runnable = [&] {
      return !queue.empty() && (!options.defer_until_synchronize || finished < run_before);
    };
    while (true) {
      if (open && !runnable()) {
        lock.unlock();
        memory->leave_operation();
        open = false;
        lock.lock();
        holding_gate = false;
        idle.notify_all();  // a synchronize waits for the gate to close too
        continue;           // something may have come meanwhile
      }
      wake.wait(lock, [&] { return stopping || runnable(); });
      if (queue.empty()) {
        if (stopping) break;
        continue;
      }
      Op op = std::move(queue.front());
      queue.pop_front();
      if (failure && !op.always) {
        finished_one();
        continue;  // a failed stream runs nothing more, as a faulted CUDA context
      }
      lock.unlock();
      // Frees and event marks touch no device memory: they need not open the gate.
      if (!op.always && !open) {
        memory->enter_operation();
        open = true;
      }
      if (options.operation_delay.count() > 0 && !op.always)
        std::this_thread::sleep_for(options.operation_delay);
      std::optional<std::string> error;
      try {
        if (injected_fault(op.name))
          error = fmt::format("{}: a fault injected by SimulatedDeviceOptions::fail_operation",
                              op.name);
        else
          op.body();
      } catch (const Error& e) {
        error = e.message();  // the checks name the operation already
      } catch (const std::exception& e) {
        error = fmt::format("{}: {}", op.name, e.what());
      }
      op.body = nullptr;  // drop what it captured (maybe the last owner of some memory) unlocked
      lock.lock();
      ++ops_run;
      holding_gate = open;
      if (error && !failure) failure = std::move(error);
      finished_one();
    }
    lock.unlock();
    if (open) memory->leave_operation();
  }

  // Whether the operation about to run is the one options.fail_operation names. Worker only.
  bool injected_fault(const std::string& name) {
    return !options.fail_operation.empty() && name == options.fail_operation &&
           ++fail_candidates == options.fail_at;
  }

  // The host waits for what is queued so far: in deferred mode it runs now. Returns the number
  // of operations the wait covers. Locked.
  uint64_t flush() {
    run_before = std::max(run_before, queued);
    wake.notify_all();
    return queued;
  }

  // Throws proxyep::Error(phase) when an operation failed. Locked.
  void require_healthy(std::string_view phase) const {
    if (failure) fail(std::string(phase), "the simulated device failed: {}", *failure);
  }

  void finished_one() {
    ++finished;
    idle.notify_all();
  }

  // An allocation's last owner is gone: unreachable at once (so an operation queued after this
  // point is refused, as a use after cudaFreeAsync would be wrong), unmapped in stream order.
  // `free_mapping` frees the mapping (none: munmap it).
  void release(std::byte* mapping, uint64_t mapped, std::function<void()> free_mapping = {}) {
    {
      std::lock_guard lock(mutex);
      if (capture) {
        std::lock_guard recording(capture->mutex);
        capture->releases.push_back(
            [this, mapping, mapped, free_mapping = std::move(free_mapping)] {
              release(mapping, mapped, free_mapping);
            });
        return;
      }
    }
    {
      std::lock_guard lock(memory->mutex);
      memory->retire(reinterpret_cast<uintptr_t>(mapping));
    }
    auto unmap = [shared = memory, mapping, mapped, free_mapping = std::move(free_mapping)] {
      {
        // Out of the gate's reach first: a stream of the device may be opening it right now.
        std::lock_guard inner(shared->mutex);
        shared->forget_retired(reinterpret_cast<uintptr_t>(mapping));
      }
      if (free_mapping)
        free_mapping();
      else
        ::munmap(mapping, mapped);
      std::lock_guard inner(shared->mutex);
      shared->device_bytes -= mapped;
    };
    std::unique_lock lock(mutex);
    if (stopped) {
      lock.unlock();
      unmap();
      return;
    }
    queue.push_back({"release", std::move(unmap), true});
    ++queued;
    lock.unlock();
    wake.notify_one();
  }
};

// An event: reached when the stream that recorded it ran everything queued before it.
struct SimulatedDevice::Event final : DeviceEvent {
  const Memory* device = nullptr;  // events order the streams of one device
  const Core* stream = nullptr;    // the one that recorded it (the host waits there)
  mutable std::mutex mutex;        // the host waits on a const event
  mutable std::condition_variable changed;
  bool reached = false;
  bool in_capture = false;  // recorded while its stream was captured: a point inside a graph
  bool captured() const override { return in_capture; }
  // Inside a capture: that capture (a stream waiting for the event joins it), and how many of
  // the recording stream's operations it held up to and with this record (what a wait of the
  // capture's origin for this event joins back).
  std::weak_ptr<Core::Capture> capture;
  uint64_t stream_ops = 0;
};

}  // namespace proxyep::gpu_side::device
