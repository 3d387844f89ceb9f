// DeviceSignals: how a DeviceRuntime's stream (device_runtime.hpp) talks to the host and to other
// devices with no host thread between its operations: descriptor rings it pushes into and 64-bit
// signal words it waits on, writes and raises. Queued like every stream operation.
#pragma once

#include "gpu_side/descriptor.hpp"
#include "gpu_side/device/signal_value.hpp"
#include "gpu_side/ring.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

namespace proxyep::gpu_side::device {

// A descriptor ring a runtime's stream produces into, from DeviceRuntime::attach_ring(). Opaque:
// it holds the producer's state (a GPU's reservation counter and cached tail in device memory).
class DeviceRingProducer {
 public:
  virtual ~DeviceRingProducer() = default;
};

class DeviceSignals {
 public:
  virtual ~DeviceSignals() = default;

  // Descriptor rings (gpu_side/ring.hpp), drained by the proxies as a host producer's are, so
  // that what kernels wrote is handed to the proxies in stream order, with no host in between.
  // attach_ring() makes this stream the producer of `ring`: a multi-producer ring (the mode GPU
  // producers need: cuda/ring_producer.cuh) whose memory is registered with this runtime and
  // that has no other producer. ring_push() queues the push of `count` descriptors from
  // `descriptors` (device memory or registered host memory) at consecutive positions, in
  // order, after the work queued before it; the header's producer head says how many were
  // pushed once it ran (quiet() counts them). A push that finds no room for `timeout` gives up:
  // it marks the ring abandoned (its consumer's health() then reports the producer failed, which
  // fails the proxy's waits, naming it) and drops the rest of the batch; the stream goes on (a
  // dead proxy must not kill the GPU context). The producer must outlive the pushes queued on
  // it (synchronize() first).
  virtual std::unique_ptr<DeviceRingProducer> attach_ring(const Ring& ring) = 0;
  virtual void ring_push(DeviceRingProducer& producer, const Descriptor* descriptors, int64_t count,
                         std::chrono::milliseconds timeout) = 0;

  // Signal words: the stream's side of a handshake with the host (the proxies, the ordering
  // layer) or a node peer, queued like every operation, so that a protocol whose waits are on
  // the stream needs no host thread between its steps (what a CUDA graph can capture: DeepEP's
  // low-latency hooks). A word is a 64-bit counter, 8-byte aligned, in registered host memory
  // or device memory, that its writers only raise (the host with an atomic release store or
  // fetch_add).
  // wait_value() makes the stream's later operations run only once the word holds at least
  // `value`. A word still short of it `timeout` after the wait began fails the stream (sticky:
  // reached(), wait_for() and synchronize() throw, naming `phase`, the word, what it held and
  // what was awaited) instead of hanging it; the operations behind a failed wait do not hang
  // either (the simulated device skips them; CUDA runs them on whatever is there, and the
  // failure is what the host reports).
  // write_value() stores `value` in the word once the operations queued before it ran, after
  // what they wrote is visible to the host (release, system scope): what a proxy acquiring the
  // word may read. Not behind a failed wait: what it let run is not signalled as done.
  // add_value() adds `delta` to the word once the operations before it ran (an atomic add,
  // release): the stream advancing an epoch word, the numbering a replayed graph's signals
  // take their values from (signal_value.hpp: a value of {epoch, offset} is read when the
  // operation runs, not when it is queued).
  // `waited_ns`, when given (an int64 in device memory, 8-byte aligned): the wait adds the
  // nanoseconds it spent before the word held the value to it (DeepEP's wait-cost statistics).
  // Each throws proxyep::Error(phase) at once, before anything is queued, for a word (or an
  // epoch word, or a waited_ns) the device cannot reach or that is misaligned.
  virtual void wait_value(const uint64_t* word, SignalValue value,
                          std::chrono::milliseconds timeout, std::string_view phase,
                          int64_t* waited_ns = nullptr) = 0;
  virtual void write_value(uint64_t* word, SignalValue value, std::string_view phase) = 0;
  virtual void add_value(uint64_t* word, uint64_t delta, std::string_view phase) = 0;
};

}  // namespace proxyep::gpu_side::device
