// StepTransport (step_link.hpp).
#include "proxy/step_link.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace proxyep::proxy {

StepTransport::StepTransport()
    : ring_memory_(HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots))),
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

StepLink StepTransport::open(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                             ProxyEngine& engine, control::SignalRouter& router,
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
  try {
    const Deadline deadline(timeout);
    gpu_side::device::NicMemory nic;
    if (fabric.capabilities().hmem) nic = device->allocate_for_nic(bytes);
    if (nic.memory) {
      try {
        engine.amend(
            [&] {
              region_ = fabric.register_memory(
                  nic.memory.get(), bytes,
                  nic.registers_as_host ? fabric::MemoryKind::host : fabric::MemoryKind::cuda);
            },
            deadline);
        device_memory_ = nic.memory;
        link_.memory = nic.memory.get();
        link_.device_memory = true;
      } catch (const Error& e) {
        // A provider may announce FI_HMEM and refuse this kind of device memory (a libfabric
        // built without CUDA): host memory serves, as without FI_HMEM.
        log::info("buffer: step memory not registered in device memory ({}); host memory serves",
                  e.what());
      }
    }
    if (!region_) {
      host_memory_ = std::make_unique<HostMemory>(HostMemory::heap(bytes));
      link_.memory = static_cast<std::byte*>(device->register_host(host_memory_->host(), bytes));
      host_registered_ = true;
      engine.amend([&] { region_ = fabric.register_memory(host_memory_->host(), bytes); },
                   deadline);
    }
    link_.bytes = bytes;
    words_ = std::make_unique<control::SignalWords>(words);
    link_.words = static_cast<const uint64_t*>(
        device->register_host(words_->bytes().data(), words_->bytes().size()));
    words_registered_ = true;
    link_.word_count = words;
    device->register_host(&ring_.header(), gpu_side::Ring::bytes_for(ring_.capacity()));
    ring_registered_ = true;
    producer_ = device->attach_ring(ring_);
    link_.ring = producer_.get();
    link_.region = kRegion;
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const auto blobs =
      bootstrap.allgather(failed.empty() ? region_->descriptor().serialize() : fabric::Bytes{},
                          fmt::format("{}(step region)", phase));
  std::string missing;
  for (size_t r = 0; r < blobs.size(); ++r)
    if (blobs[r].empty()) missing += fmt::format(" {}", r);
  if (!missing.empty()) {
    release();
    if (region_) engine.amend([&] { region_.reset(); }, Deadline(timeout));  // the fabric's too
    device_ = nullptr;
    fail(where, "ranks{} could not make their step memory{}", missing,
         failed.empty() ? std::string() : fmt::format(" (this rank: {})", failed));
  }
  engine.amend(
      [&] {
        engine.regions().add_local(kRegion, *region_);
        for (size_t r = 0; r < blobs.size(); ++r)
          engine.regions().add_remote(static_cast<int>(r), kRegion,
                                      fabric::RegionDescriptor::deserialize(blobs[r]));
        router.attach_words(*words_);
      },
      Deadline(timeout));
  bootstrap.barrier(fmt::format("{}(step transport ready)", phase));
  // A graph's pushes and arrivals ring no doorbell: the proxies keep polling from now on, for
  // the session's life (proxy.graph_polling).
  if (params::proxy_graph_polling.get()) engine.keep_polling(true);
  log::debug(
      "buffer: rank {}: captured steps reach other nodes through {} bytes of {} ({} signal words)",
      bootstrap.rank(), bytes,
      link_.device_memory ? "device memory the NIC reaches (FI_HMEM)"
                          : "host memory registered with the device",
      words);
  return link_;
}

}  // namespace proxyep::proxy
