// InProcessSession: the Session whose proxy threads run in this process (the embedded default:
// nothing to start beside the ranks). Construction is collective:
//  1. the sizes are checked equal on every rank (one versioned record through the bootstrap);
//  2. every rank creates its arena in a memfd and the node's ranks map each other's
//     (NodeMemory): NodeChannels for them and for the rank itself;
//  3. when the group spans nodes: the fabric opens and connects, the arena (remote target) and
//     the staging area (local source) are registered and their descriptors exchanged, a ring
//     with a doorbell goes to a ProxyEngine, the counter bank and every FabricChannel's window
//     and credits are attached to the signal router, and the proxy threads start. With
//     SessionConfig::device a second ring (no doorbell) goes to the engine too, for a
//     device's stream to push into (route_posts, device_route.hpp), a third for steps captured
//     into graphs (open_step_link, step_link.hpp), and where the fabric registers device
//     memory (FI_HMEM), a device staging area for its chunks.
#pragma once

#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/device_arenas.hpp"
#include "proxy/device_routing.hpp"
#include "proxy/fabric_channel.hpp"
#include "proxy/node_memory.hpp"
#include "proxy/proxy_engine.hpp"
#include "proxy/session.hpp"
#include "proxy/step_link.hpp"

#include <memory>
#include <vector>

namespace proxyep::proxy {

class InProcessSession final : public Session {
 public:
  InProcessSession(control::Bootstrap& bootstrap, const SessionConfig& config);
  ~InProcessSession() override;

  PeerChannel& channel(int peer) const override {
    return *state_->channels.at(static_cast<size_t>(peer));
  }
  void begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device) override;
  void await(const Wait& wait) override;
  void quiet(std::string_view phase) override;
  void check_health(std::string_view phase) const override;
  std::optional<std::string> peer_lost(int rank) const override;
  void ignore_peer(int rank, bool ignored) override;
  void stop() noexcept override;
  std::span<std::byte> data_area() const override;
  std::span<std::byte> staging_data_area() const override;
  std::vector<std::span<std::byte>> row_memory() const override;
  std::string describe() const override;
  std::vector<ThreadStats> proxy_thread_stats() const override;
  bool proxy_failed() const override;
  bool route_posts(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                   std::string_view phase) override;
  void flush_posts() override;
  StepLink open_step_link(control::Bootstrap& bootstrap,
                          const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                          uint64_t bytes, uint32_t words, std::string_view phase) override;
  uint64_t chunks_from_device_memory() const override {
    return state_->link ? state_->link->device_chunks() : 0;
  }
  uint64_t sends_to_device_arenas() const override { return state_->device_arenas->sends(); }
  uint64_t writes_from_device() const override {
    return state_->device_routing ? state_->device_routing->posted() : 0;
  }
  std::optional<fabric::ReorderStats> reorder_stats() const override {
    return state_->fabric ? state_->fabric->reorder_stats() : std::nullopt;
  }

 private:
  void open_fabric(control::Bootstrap& bootstrap, const SessionConfig& config);
  // FI_HMEM: registers device memory of config.device the NIC reads as the device staging area
  // (FabricLink::set_device_staging) when the fabric and the device both can.
  void open_device_staging(const SessionConfig& config);
  // FI_HMEM: registers this rank's device arena with the fabric when it can (collective: every
  // rank shares whether it did). Returns, by rank, whether its device arena is a write target.
  std::vector<bool> open_device_landing(control::Bootstrap& bootstrap);
  // Has the device's stream push what the route was handed, before a wait for what answers it.
  void drive_route(std::string_view phase);
  // await() for a wait with on_lost: lost and late ranks are offered to it.
  void await_tolerant(const Wait& wait);
  // Stops the proxy threads; when one had to be detached, leaks the state it may touch.
  void stop_and_settle() noexcept;

  // Everything the proxy threads may touch, in construction order. When stop() had to detach a
  // thread stuck inside the provider (ProxyEngine::abandoned), the destructor leaks it whole:
  // the thread may return at any time and use the fabric, the router, the banks, the windows
  // and the registered memory.
  struct State {
    std::unique_ptr<NodeMemory> node;
    std::unique_ptr<DeviceArenas> device_arenas;  // SessionConfig::device's, for node peers
    // The fabric path (only when the group spans nodes).
    std::unique_ptr<fabric::Fabric> fabric;
    std::unique_ptr<HostMemory> staging;
    std::unique_ptr<fabric::MemoryRegion> arena_region, staging_region, landing_region;
    // FI_HMEM: this rank's device arena registered, where other nodes' device calls write.
    std::unique_ptr<fabric::MemoryRegion> device_arena_region;
    // FI_HMEM: the device staging area (SessionConfig::device) and its registration.
    std::shared_ptr<std::byte[]> device_staging;
    std::unique_ptr<fabric::MemoryRegion> device_staging_region;
    // Records: key = source; eager bytes: key = R + source.
    std::unique_ptr<control::CounterBank> counters;
    control::SignalRouter router;
    // Before the engine, which releases its claim on the ring when destroyed.
    std::unique_ptr<HostMemory> ring_memory;
    // SessionConfig::device: the ring a device's stream pushes into, and its route.
    std::unique_ptr<DeviceRouting> device_routing;
    // SessionConfig::device: the ring its captured steps push into, and what open_step_link()
    // adds (step_link.hpp). After the router it counts words into, before the engine.
    std::unique_ptr<StepTransport> step;
    std::unique_ptr<InProcessSteps> step_proxy;  // at open_step_link(); holds the registration
    std::unique_ptr<gpu_side::Doorbell> doorbell;
    std::unique_ptr<ProxyEngine> engine;
    std::unique_ptr<gpu_side::RingProducer> producer;
    std::unique_ptr<FabricLink> link;
    // By rank: NodeChannel for this node's ranks (this rank included), FabricChannel for
    // others. The router points into the fabric channels: stop() ends the proxy threads first.
    std::vector<std::unique_ptr<PeerChannel>> channels;
  };

  std::chrono::milliseconds timeout_;
  const control::PeerWatch* peers_;  // the bootstrap's liveness (null: a world of one)
  std::unique_ptr<State> state_ = std::make_unique<State>();
};

}  // namespace proxyep::proxy
