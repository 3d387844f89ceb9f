// A session's writes pushed into a descriptor ring by a device's stream (device_route.hpp).
#include "proxy/session/device_route.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "proxy/session/session_waits.hpp"

#include <algorithm>

namespace proxyep::proxy {

DeviceRoute::DeviceRoute(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                         gpu_side::Ring ring, std::chrono::milliseconds timeout,
                         CheckDrain check_drain, std::string_view phase)
    : device_(std::move(device)),
      ring_(ring),
      timeout_(timeout),
      check_drain_(std::move(check_drain)),
      staged_memory_(HostMemory::heap(ring.capacity() * sizeof(gpu_side::Descriptor))),
      staged_(static_cast<gpu_side::Descriptor*>(staged_memory_.host())),
      staged_device_(nullptr) {
  require(ring_.producer_mode() == gpu_side::ProducerMode::multi && head() == 0, phase,
          "a device's stream pushes only into a multi-producer ring no one has pushed into");
  try {
    device_->register_host(&ring_.header(), gpu_side::Ring::bytes_for(ring_.capacity()));
    ring_registered_ = true;
    staged_device_ = static_cast<gpu_side::Descriptor*>(
        device_->register_host(staged_memory_.host(), staged_memory_.size()));
    staged_registered_ = true;
    producer_ = device_->attach_ring(ring_);
  } catch (...) {
    release();
    throw;
  }
}

DeviceRoute::~DeviceRoute() {
  try {
    // The stream must have run the pushes that read the staged array and use the producer.
    flush();
    if (!pushed_all()) device_->synchronize("buffer teardown", timeout_);
  } catch (const std::exception& e) {
    log::warn("buffer: the device's stream did not finish its ring pushes: {}", e.what());
  }
  set_active(false);
  release();
}

void DeviceRoute::release() noexcept {
  producer_.reset();
  try {
    if (staged_registered_) device_->unregister_host(staged_memory_.host());
    if (ring_registered_) device_->unregister_host(&ring_.header());
  } catch (const std::exception& e) {
    log::warn("buffer: unregistering the device's descriptor ring: {}", e.what());
  }
  staged_registered_ = ring_registered_ = false;
}

uint64_t DeviceRoute::post(const gpu_side::Descriptor& descriptor, std::string_view phase) {
  const uint64_t capacity = ring_.capacity();
  if (posted_ >= capacity && !retired(posted_ - capacity)) {
    // The staged descriptor about to be overwritten may still be unread by the stream: let it
    // push what it has, then wait for the proxy to finish that write.
    drive(phase);
    const uint64_t reused = posted_ - capacity;
    const Deadline deadline(timeout_);
    Poller poller;
    while (!retired(reused)) {
      check_drain_(phase);
      if (deadline.expired())
        fail(std::string(phase),
             "the write at position {} of the device's descriptor ring did not complete "
             "before the deadline: the proxy made no progress",
             reused);
      poller.pause();
    }
  }
  staged_[posted_ % capacity] = descriptor;
  return posted_++;
}

void DeviceRoute::flush() {
  const uint64_t capacity = ring_.capacity();
  while (flushed_ < posted_) {
    const uint64_t at = flushed_ % capacity;
    const uint64_t count = std::min(posted_ - flushed_, capacity - at);
    device_->ring_push(*producer_, staged_device_ + at, static_cast<int64_t>(count), timeout_);
    flushed_ += count;
  }
}

bool DeviceRoute::pushed_all() const {
  return flushed_ == posted_ && head() >= posted_;
}

void DeviceRoute::drive(std::string_view phase) {
  try {
    flush();
    if (head() >= posted_) return;
    const std::shared_ptr<gpu_side::device::DeviceEvent> pushed = device_->record();
    device_->wait_for(*pushed, phase, timeout_);
    require(head() >= posted_, phase,
            "the {} device's stream gave up pushing descriptors {} to {} (the ring stayed full: "
            "the proxy stopped draining it)",
            device_->kind(), head(), posted_);
  } catch (const Error&) {
    check_drain_(phase);  // a failed proxy is the cause to name, when there is one
    throw;
  }
}

void DeviceRoute::set_active(bool active) {
  gpu_side::atomic(ring_.header().producer.waiting)
      .store(active ? 1u : 0u, std::memory_order_release);
}

}  // namespace proxyep::proxy
