// The proxy host in this process (proxy_host_in_process.hpp).
#include "proxy/session/proxy_host_in_process.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/step_clock.hpp"
#include "proxy/engine/fabric_connections.hpp"
#include "proxy/session/session.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";

}  // namespace

HostOpened InProcessHost::open(const HostAttach& attach) {
  const SessionConfig& config = attach.config;
  RankProxyOptions options{
      .rank = rank_,
      .ranks = attach.layout.sizes().ranks,
      .fabric = config.fabric ? *config.fabric : fabric::FabricOptions::from_params(rank_),
      .engine = config.engine ? *config.engine : EngineOptions::from_params(),
      .peers = peers_,
      .phase = kPhase};
  options.engine.tolerate_peer_failures = config.tolerate_peer_failures;
  proxy_ = std::make_unique<RankProxy>(std::move(options), attach.router);
  mark_step(config.setup_clock, "fabric open");
  proxy_->register_rank_memory({attach.node.local(), attach.node.bytes()}, attach.staging.bytes());
  HostOpened opened;
  if (proxy_->register_landing(config.landing, config.landing_fabric))
    opened.landing = proxy_->landing_descriptor();
  mark_step(config.setup_clock, "memory registered");
  // The proxy threads live in this process: an address of the caller's is theirs too.
  opened.from_caller = config.send_from_caller && !proxy_->capabilities().mr_local;
  if (opened.from_caller) proxy_->regions().add_local_address_space(region::kCallerMemory);
  proxy_->add_ring(attach.ring, &attach.doorbell);
  // No doorbells: the route keeps the proxy thread polling while a device call posts, and a
  // graph's steps ring none (the threads keep polling once the steps are linked).
  if (attach.route_ring) proxy_->add_ring(attach.route_ring->ring(), nullptr);
  if (attach.steps) proxy_->add_ring(attach.steps->ring(), nullptr);
  if (config.device) opened.device_staging = open_device_staging(attach);
  // As for device staging: from the capabilities alone, and a registration the provider refuses
  // leaves the host arena the target, as without FI_HMEM.
  const DeviceArenas& arenas = attach.device_arenas;
  if (arenas.local() != nullptr && arenas.nic_reads()) {
    const std::string why = proxy_->register_device_memory(
        DeviceMemoryUse::arena,
        {.memory = std::shared_ptr<std::byte[]>(arenas.local(), [](std::byte*) {}),
         .bytes = arenas.bytes(),
         .registers_as_host = arenas.registers_as_host()});
    if (why.empty()) opened.device_arena = proxy_->device_arena_descriptor();
  }
  opened.addresses = proxy_->addresses();
  opened.arena = proxy_->arena_descriptor();
  return opened;
}

std::byte* InProcessHost::open_device_staging(const HostAttach& attach) {
  const uint64_t bytes = attach.layout.sizes().staging_bytes;
  // Chosen from the capabilities alone: a provider that registers device memory (FI_HMEM; EFA
  // does) and a device whose memory a NIC reads. Otherwise the host staging area is the bounce
  // buffer.
  if (bytes == 0 || !proxy_->capabilities().hmem) return nullptr;
  gpu_side::device::NicMemory nic = attach.config.device->allocate_for_nic(bytes);
  if (!nic.memory) return nullptr;
  if (!proxy_->register_device_memory(DeviceMemoryUse::staging, std::move(nic)).empty())
    return nullptr;
  log::debug(
      "buffer: rank {}: device calls write their chunks from {} bytes of {} memory (FI_HMEM)",
      rank_, bytes, attach.config.device->kind());
  return proxy_->device_memory(DeviceMemoryUse::staging);
}

void InProcessHost::open_connections(const std::vector<int>& peers, const Deadline& deadline) {
  open_fabric_connections(proxy_->fabric(), proxy_->regions(), peers, peers_, deadline, kPhase);
}

void InProcessHost::wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                               std::string_view phase,
                               const std::function<std::string()>& describe) {
  try {
    proxy_->engine().wait_until(ready, deadline, describe);
  } catch (const Error& e) {
    fail(std::string(phase), "{}", e.what());
  }
}

void InProcessHost::quiet(const FabricPoster&, const DeviceRouteRing*, std::string_view phase) {
  // The engine counts every ring's pushes, the device's among them.
  try {
    proxy_->engine().quiet(Deadline(timeout_));
  } catch (const Error& e) {
    fail(std::string(phase), "{}", e.what());
  }
}

void InProcessHost::check_health(std::string_view phase) const {
  if (!failed()) return;
  auto failure = proxy_->engine().health().failure();
  fail(std::string(phase), "the Buffer's proxy failed earlier ({}: {}); create a new Buffer",
       failure ? failure->phase : "?", failure ? failure->message : "?");
}

std::optional<std::string> InProcessHost::peer_failure(int rank) const {
  if (!proxy_) return std::nullopt;
  if (auto failure = proxy_->engine().health().peer_failure(rank))
    return fmt::format("{}: {}", failure->phase, failure->message);
  return std::nullopt;
}

std::vector<ThreadStats> InProcessHost::thread_stats() const {
  return proxy_ ? proxy_->engine().all_thread_stats() : std::vector<ThreadStats>{};
}

std::string InProcessHost::describe() const {
  return fmt::format("in process ({}, {} threads)",
                     proxy_ ? proxy_->capabilities().provider : std::string("?"),
                     proxy_ ? proxy_->engine().threads() : 0);
}

HostMemory InProcessHost::host_memory(uint64_t bytes, std::string_view) {
  return HostMemory::heap(bytes);
}

DeviceStepMemory InProcessHost::register_device_memory(gpu_side::device::DeviceRuntime& device,
                                                       uint64_t bytes, const Deadline&,
                                                       std::string_view) {
  if (!proxy_->capabilities().hmem) return {};
  gpu_side::device::NicMemory nic = device.allocate_for_nic(bytes);
  if (!nic.memory) return {};
  std::shared_ptr<std::byte[]> memory = nic.memory;
  nic.bytes = bytes;
  if (!proxy_->register_device_memory(DeviceMemoryUse::steps, std::move(nic)).empty()) return {};
  return {.memory = memory, .descriptor = *proxy_->step_descriptor()};
}

fabric::Bytes InProcessHost::register_host_memory(const HostMemory& memory, const Deadline&,
                                                  std::string_view) {
  return proxy_->register_step_memory(memory.bytes());
}

void InProcessHost::link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
                         bool keep_polling, const Deadline&, std::string_view) {
  proxy_->link_steps(descriptors, words, keep_polling);
}

void InProcessHost::unregister(const Deadline&) {
  proxy_->drop_step_memory();
}

}  // namespace proxyep::proxy
