// DeviceRoute: a session's writes to other nodes handed to the proxies by a device's stream
// instead of the protocol thread, so that a write leaves only after the kernels queued before it
// (the ones that packed its staging) have run, and the host never waits for them first.
//
// The session keeps a second descriptor ring for it (multi-producer, the mode a GPU producer
// needs, and no doorbell: a stream cannot ring one). The route registers that ring and an array
// of staged descriptors with the device; post() writes a descriptor into the array and returns
// its position in the device ring, flush() queues one DeviceRuntime::ring_push for every
// descriptor staged since the last flush, and the stream pushes them in order once the work
// before it ran. Positions are exact because the stream is the ring's only producer.
//
//   staged[position % capacity]  written by the host in post(), read by the stream's push; reused
//                                once the write at position - capacity retired (then the stream
//                                surely read it)
//   ring header producer head    published by the stream after a push: how many it pushed
//   ring header retired prefix   published by the proxy: which writes completed locally
//
// Until the stream runs them, the pushes are only queued: a host about to wait for something a
// peer sends in answer, or for its own writes (quiet), first drives the route, which waits for
// the stream to have pushed everything queued (an event after the last push). A stream that
// runs on its own (a GPU's) is seldom still behind by then.
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ring.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string_view>

namespace proxyep::proxy {

class DeviceRoute {
 public:
  // Asked while a wait for the proxy lasts: throws proxyep::Error(phase) once the proxy failed.
  using CheckDrain = std::function<void(std::string_view phase)>;

  // Registers `ring` (a multi-producer ring no one has pushed into, whose memory stays mapped
  // while the route lives) and the staged array with `device` and makes its stream the ring's
  // producer. Throws proxyep::Error(phase), with nothing left registered, when it cannot.
  DeviceRoute(std::shared_ptr<gpu_side::device::DeviceRuntime> device, gpu_side::Ring ring,
              std::chrono::milliseconds timeout, CheckDrain check_drain, std::string_view phase);
  // Waits (bounded) for the stream to run the pushes queued on it, then unregisters; a failure
  // is logged, not thrown.
  ~DeviceRoute();
  DeviceRoute(const DeviceRoute&) = delete;
  DeviceRoute& operator=(const DeviceRoute&) = delete;

  const gpu_side::device::DeviceRuntime& device() const { return *device_; }

  // Stages `descriptor` for the stream and returns its position in the ring. Waits (ep.timeout)
  // only when the staged array is full of writes the proxy has not finished.
  uint64_t post(const gpu_side::Descriptor& descriptor, std::string_view phase);
  // Queues the push of everything staged since the last flush on the stream (in one batch, two
  // where the array wraps).
  void flush();
  // flush(), then waits until the stream has pushed every descriptor posted so far; throws
  // proxyep::Error(phase) for a failed stream, at the deadline, or when the stream gave up a push
  // (the proxy stopped draining the ring), naming the proxy's failure instead when it has one.
  void drive(std::string_view phase);
  // Whether the stream has pushed every descriptor posted so far (drive() has nothing to do).
  bool pushed_all() const;
  // Has the write at ring position `position` completed locally (its source may be rewritten)?
  bool retired(uint64_t position) const {
    return gpu_side::atomic(ring_.header().consumer.retired).load(std::memory_order_acquire) >
           position;
  }
  // While active, the proxy thread keeps polling the ring (it has no doorbell to wake it):
  // on for the span of a device call's posts.
  void set_active(bool active);
  uint64_t posted() const { return posted_; }

 private:
  uint64_t head() const {
    return gpu_side::atomic(ring_.header().producer.head).load(std::memory_order_acquire);
  }
  void release() noexcept;

  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  gpu_side::Ring ring_;
  std::chrono::milliseconds timeout_;
  CheckDrain check_drain_;
  HostMemory staged_memory_;
  gpu_side::Descriptor* staged_;         // host address
  gpu_side::Descriptor* staged_device_;  // the same array as the stream addresses it
  bool ring_registered_ = false, staged_registered_ = false;
  std::unique_ptr<gpu_side::device::DeviceRingProducer> producer_;
  uint64_t posted_ = 0;   // descriptors staged = the ring position of the next one
  uint64_t flushed_ = 0;  // descriptors whose push is queued on the stream
};

}  // namespace proxyep::proxy
