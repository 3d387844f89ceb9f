// DaemonSession: the Session of a rank whose proxy threads run in the node daemon (proxyepd,
// proxy.mode = daemon). Node peers are reached exactly as in process (shared arenas,
// NodeChannel); ranks on other nodes through FabricChannels whose ring the daemon drains:
//
//   this rank                                      proxyepd (daemon/attached_client.hpp)
//   arena, staging, ring, relay: memfds  --fds-->  maps them, opens a fabric endpoint,
//   doorbell: eventfd                              registers arena and staging
//   allgather fabric addresses (bootstrap) ----->  connects every rank's endpoint
//   allgather arena descriptors (bootstrap) ---->  fills its region table
//   barrier, then start ------------------------>  proxy threads drain the ring
//   FabricChannel pushes descriptors ----------->  RMA writes with immediates
//   waits drain the relay ring into the router <-  immediates that arrived (signal_relay.hpp)
//   retired prefix in the ring header <---------   local completions (staging reuse, quiet)
//
// What differs from the in-process session: waits poll (spin, yield, nap) instead of sleeping
// on the proxy threads' futex, and each poll drains the relay; the daemon's health comes over
// the socket (a failure frame, or the socket's end when the daemon exits), which every wait,
// quiet and full-ring push checks, so a dead daemon fails the call at once, naming its socket.
// The landing region (a memfd the node's ranks map) goes to the daemon too, which registers it
// as in process (ep.landing_fabric), so other nodes' rows land straight in recv_x; so does the
// device ring (SessionConfig::device, device_routing.hpp), a memfd the daemon drains beside
// the first ring, so that device calls hand their writes to the daemon from the device's stream.
// Device memory (where the daemon's fabric registers it, FI_HMEM): this rank offers its device
// staging and device arena by their handles (DeviceRuntime::allocate_shared), which the daemon
// opens and registers (daemon/client_device_memory.hpp), so a device call's chunks leave from
// device memory and other nodes' rows land in the device arena, as in process.
// Captured low-latency steps between nodes (step_link.hpp) go through the daemon too: their ring
// passed with the attach, their memory and signal words at the first captured call
// (daemon_steps.hpp); the daemon counts the words itself, since no thread of this process
// relays immediates while a graph runs.
// The caller's own memory (x) is not the daemon's: no writes straight from x (ep.send_from_x does
// not apply).
#pragma once

#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/daemon_connection.hpp"
#include "control/signal_router.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/device_arenas.hpp"
#include "proxy/device_routing.hpp"
#include "proxy/fabric_channel.hpp"
#include "proxy/node_memory.hpp"
#include "proxy/session.hpp"
#include "proxy/signal_relay.hpp"
#include "proxy/step_link.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::proxy {

class DaemonSession final : public Session {
 public:
  // Collective over `bootstrap`; config.daemon_socket names this node's daemon. Throws
  // proxyep::Error("buffer"): no daemon there, refused, or any step of the attach failing.
  DaemonSession(control::Bootstrap& bootstrap, const SessionConfig& config);
  ~DaemonSession() override;

  PeerChannel& channel(int peer) const override { return *channels_.at(static_cast<size_t>(peer)); }
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
  bool route_posts(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                   std::string_view phase) override;
  void flush_posts() override;
  StepLink open_step_link(control::Bootstrap& bootstrap,
                          const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                          uint64_t bytes, uint32_t words, std::string_view phase) override;
  uint64_t chunks_from_device_memory() const override { return link_ ? link_->device_chunks() : 0; }
  uint64_t sends_to_device_arenas() const override { return device_arenas_->sends(); }
  uint64_t writes_from_device() const override {
    return device_routing_ ? device_routing_->posted() : 0;
  }
  std::optional<fabric::ReorderStats> reorder_stats() const override { return std::nullopt; }
  // The proxy threads are the daemon's: its metrics endpoint reports them.
  std::vector<ThreadStats> proxy_thread_stats() const override { return {}; }
  bool proxy_failed() const override { return failure_.has_value(); }

 private:
  void attach(control::Bootstrap& bootstrap, const SessionConfig& config);
  // Has the daemon probe this rank's fabric connections (fabric_connections.hpp) and polls it
  // until they are open.
  void open_connections(const Deadline& deadline);
  // Adds to the attach request the device memory the daemon's NIC may use where its fabric
  // registers device memory (FI_HMEM): device staging (allocated here) and the device arena.
  void offer_device_memory(gpu_side::device::DeviceRuntime& device, nlohmann::json& attach,
                           std::vector<int>& fds);
  // Has the device's stream push what the route was handed, before a wait for what answers it.
  void drive_route(std::string_view phase);
  // Reads the daemon's socket (notices and failures); the failure text once there is one.
  const std::optional<std::string>& poll_daemon() const;
  // Routes what the daemon relayed, and reads its socket every few polls: throws
  // proxyep::Error(phase) once the daemon failed or is gone.
  void pump(std::string_view phase);
  // Polls until `ready()` (which pump() feeds), the deadline, or the daemon's failure.
  void poll_until_ready(const std::function<bool()>& ready, const Deadline& deadline,
                        std::string_view phase, const std::function<std::string()>& describe);

  std::chrono::milliseconds timeout_;
  const control::PeerWatch* peers_;
  std::unique_ptr<NodeMemory> node_;
  std::unique_ptr<DeviceArenas> device_arenas_;  // SessionConfig::device's, for node peers
  mutable std::optional<control::DaemonConnection> daemon_;  // read by const health checks
  std::unique_ptr<HostMemory> staging_, ring_memory_, relay_memory_;
  // Device memory the daemon registered as this rank's device staging (FI_HMEM); none else.
  gpu_side::device::SharedMemory device_staging_;
  std::unique_ptr<gpu_side::Doorbell> doorbell_;
  // SessionConfig::device: a memfd ring the daemon drains beside the first (before the
  // link and the channels, which hold its route's positions).
  std::unique_ptr<DeviceRouting> device_routing_;
  // SessionConfig::device, a group that spans nodes: the captured steps' ring (a memfd the
  // daemon drains), memory and words (daemon_steps.hpp).
  std::unique_ptr<StepTransport> step_;
  std::unique_ptr<control::CounterBank> counters_;
  control::SignalRouter router_;
  std::unique_ptr<RelayReceiver> relay_;
  std::unique_ptr<gpu_side::RingProducer> producer_;
  std::unique_ptr<FabricLink> link_;
  std::vector<std::unique_ptr<PeerChannel>> channels_;
  std::string provider_;
  mutable std::optional<std::string> failure_;                     // the daemon's, once known
  mutable std::vector<std::optional<std::string>> peer_failures_;  // peers the daemon gave up
  uint32_t polls_since_socket_ = 0;
};

}  // namespace proxyep::proxy
