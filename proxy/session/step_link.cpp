// StepTransport (step_link.hpp).
#include "proxy/session/step_link.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace proxyep::proxy {

StepTransport::StepTransport(HostMemory ring_memory)
    : ring_memory_(std::move(ring_memory)),
      ring_(gpu_side::Ring::create(ring_memory_.bytes(), kRingSlots,
                                   gpu_side::ProducerMode::multi)) {}

StepTransport::~StepTransport() {
  if (device_ == nullptr) return;
  try {
    // A launched graph may still push into the ring and read the words and the memory.
    device_->synchronize("buffer teardown (step transport)", timeout_);
  } catch (const std::exception& e) {
    log::warn("buffer: the device's stream did not finish its step pushes: {}", e.what());
  }
  release();
}

void StepTransport::release() noexcept {
  producer_.reset();
  try {
    if (ring_registered_) device_->unregister_host(&ring_.header());
    if (words_registered_) device_->unregister_host(words_->bytes().data());
    if (host_registered_) device_->unregister_host(host_memory_->host());
  } catch (const std::exception& e) {
    log::warn("buffer: unregistering the step transport from the device: {}", e.what());
  }
  ring_registered_ = words_registered_ = host_registered_ = false;
}

fabric::Bytes StepTransport::make(StepProxy& proxy, uint64_t bytes, uint32_t words,
                                  const Deadline& deadline, std::string_view phase) {
  gpu_side::device::DeviceRuntime& device = *device_;
  fabric::Bytes descriptor;
  if (DeviceStepMemory nic = proxy.register_device_memory(device, bytes, deadline, phase);
      nic.memory) {
    device_memory_ = nic.memory;
    link_.memory = nic.memory.get();
    link_.device_memory = true;
    descriptor = std::move(nic.descriptor);
  } else {
    host_memory_ = std::make_unique<HostMemory>(proxy.host_memory(bytes, "step memory"));
    link_.memory = static_cast<std::byte*>(device.register_host(host_memory_->host(), bytes));
    host_registered_ = true;
    descriptor = proxy.register_host_memory(*host_memory_, deadline, phase);
  }
  link_.bytes = bytes;
  words_ = std::make_unique<control::SignalWords>(
      words, proxy.host_memory(control::SignalWords::bytes_for(words), "step words"));
  link_.words = static_cast<const uint64_t*>(
      device.register_host(words_->bytes().data(), words_->bytes().size()));
  words_registered_ = true;
  link_.word_count = words;
  device.register_host(&ring_.header(), ring_bytes());
  ring_registered_ = true;
  producer_ = device.attach_ring(ring_);
  link_.ring = producer_.get();
  link_.region = region::kSteps;
  return descriptor;
}

StepLink StepTransport::open(control::Bootstrap& bootstrap, StepProxy& proxy,
                             const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                             uint64_t bytes, uint32_t words, std::chrono::milliseconds timeout,
                             std::string_view phase) {
  const std::string where(phase);
  require(device_ == nullptr, where,
          "the step transport is open already (once per Buffer; its memory stays for the "
          "Buffer's life)");
  require(device != nullptr && bytes > 0 && words > 0, where,
          "step memory needs a device, bytes and words");
  device_ = device;
  timeout_ = timeout;
  // This rank's part; a failure is shared with every rank before anyone throws, so that all
  // fail alike instead of waiting for the one that did.
  std::string failed;
  fabric::Bytes descriptor;
  try {
    descriptor = make(proxy, bytes, words, Deadline(timeout), phase);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const auto blobs = bootstrap.allgather(failed.empty() ? descriptor : fabric::Bytes{},
                                         fmt::format("{}(step region)", phase));
  std::string missing;
  for (size_t r = 0; r < blobs.size(); ++r)
    if (blobs[r].empty()) missing += fmt::format(" {}", r);
  if (!missing.empty()) {
    release();
    try {
      proxy.unregister(Deadline(timeout));
    } catch (const std::exception& e) {
      log::warn("buffer: dropping the step memory's registration: {}", e.what());
    }
    device_ = nullptr;
    fail(where, "ranks{} could not make their step memory{}", missing,
         failed.empty() ? std::string() : fmt::format(" (this rank: {})", failed));
  }
  // A graph's pushes and arrivals ring no doorbell: the proxies keep polling from now on, for
  // the session's life (proxy.graph_polling).
  proxy.link(blobs, *words_, params::proxy_graph_polling.get(), Deadline(timeout), phase);
  bootstrap.barrier(fmt::format("{}(step transport ready)", phase));
  log::debug(
      "buffer: rank {}: captured steps reach other nodes through {} bytes of {} ({} signal words)",
      bootstrap.rank(), bytes,
      link_.device_memory ? "device memory the NIC reaches (FI_HMEM)"
                          : "host memory registered with the device",
      words);
  return link_;
}

}  // namespace proxyep::proxy
