// DaemonHost: the proxy host of a rank whose proxy threads run in the node daemon (proxyepd,
// proxy.mode = daemon). The daemon's ServedRank (daemon/served_rank.hpp) holds the RankProxy;
// this side passes it the session's memory and answers for it:
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
// What differs from the in-process host: waits poll (spin, yield, nap) instead of sleeping on
// the proxy threads' futex, and each poll drains the relay into the session's router (the
// rank's one router; the daemon decodes nothing but the captured steps' words); the daemon's
// health comes over the socket (a failure frame, or the socket's end when the daemon exits),
// which every wait, quiet and full-ring push checks, so a dead daemon fails the call at once,
// naming its socket. The landing region (a memfd the node's ranks map) goes to the daemon too,
// which registers it as in process (ep.landing_fabric); so do the device ring and the step ring
// (SessionConfig::device), memfds the daemon drains beside the first.
// Device memory (where the daemon's fabric registers it, FI_HMEM): this rank offers its device
// staging and device arena by their handles (DeviceRuntime::allocate_shared), which the daemon
// opens and registers (daemon/client_device_memory.hpp), so a device call's chunks leave from
// device memory and other nodes' rows land in the device arena, as in process.
// Captured steps (step_link.hpp): their memory and words at the first captured call:
//
//   {"proxyep":"step_memory","bytes":n,               opens the device memory by its handle
//     ["device_memory":{"kind","step":{..}}]}   (FI_HMEM) or maps the memfd, registers it
//     + [memfd of host step memory, or device fd] --> {"proxyep":"step_memory_registered",
//                                                      "region":hex | "note":"why not"}
//   allgather the regions (bootstrap)
//   {"proxyep":"step_link","words":w,"descriptors":   every rank's region under the step id,
//     [hex, ...],"keep_polling":bool}                 the words' memfd mapped and counted by
//     + memfd of the signal words --------------------> the daemon; {"proxyep":"step_linked"}
//
// The daemon counts the words itself: no thread of this process relays immediates while a
// graph runs. Device memory it declines comes back with a note: host memory in a memfd serves.
// The caller's own memory (x) is not the daemon's: no writes straight from x (ep.send_from_x
// does not apply).
#pragma once

#include "control/daemon_connection.hpp"
#include "proxy/engine/signal_relay.hpp"
#include "proxy/session/proxy_host.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace proxyep::proxy {

class DaemonHost final : public ProxyHost {
 public:
  // The daemon is SessionConfig::daemon_socket, reached at open().
  DaemonHost(int rank, std::chrono::milliseconds timeout, const control::PeerWatch* peers)
      : rank_(rank), timeout_(timeout), peers_(peers) {}
  ~DaemonHost() override { stop(); }

  // Throws proxyep::Error("buffer"): no daemon there, refused, or any step of the attach
  // failing.
  HostOpened open(const HostAttach& attach) override;
  void connect(const std::vector<fabric::Bytes>& addresses) override;
  void add_regions(const std::vector<fabric::Bytes>& arenas,
                   const std::vector<fabric::Bytes>& landings,
                   const std::vector<fabric::Bytes>& device_arenas) override;
  // As in process (fabric_connections.hpp), with the daemon driving the probes: it answers each
  // poll at once and serves its other ranks meanwhile.
  void open_connections(const std::vector<int>& peers, const Deadline& deadline) override;
  void start() override;

  void wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                  std::string_view phase, const std::function<std::string()>& describe) override;
  void quiet(const FabricPoster& poster, const DeviceRouteRing* route_ring,
             std::string_view phase) override;
  void check_health(std::string_view phase) const override;
  bool failed() const override { return failure_.has_value(); }
  std::optional<std::string> peer_failure(int rank) const override;
  void stop() noexcept override;
  std::string describe() const override;

  HostMemory host_memory(uint64_t bytes, std::string_view what) override;
  DeviceStepMemory register_device_memory(gpu_side::device::DeviceRuntime& device, uint64_t bytes,
                                          const Deadline& deadline,
                                          std::string_view phase) override;
  fabric::Bytes register_host_memory(const HostMemory& memory, const Deadline& deadline,
                                     std::string_view phase) override;
  void link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
            bool keep_polling, const Deadline& deadline, std::string_view phase) override;
  // Nothing to ask: the daemon drops the registration when the next one replaces it or the
  // client detaches.
  void unregister(const Deadline&) override {}

 private:
  // Adds to the attach request the device memory the daemon's NIC may use where its fabric
  // registers device memory (FI_HMEM): device staging (allocated here) and the device arena.
  void offer_device_memory(const HostAttach& attach, nlohmann::json& request,
                           std::vector<int>& fds);
  // Reads the daemon's socket (notices and failures); the failure text once there is one.
  const std::optional<std::string>& poll_daemon() const;
  // Routes what the daemon relayed, and reads its socket every few polls: throws
  // proxyep::Error(phase) once the daemon failed or is gone.
  void pump(std::string_view phase);

  int rank_;
  std::chrono::milliseconds timeout_;
  const control::PeerWatch* peers_;
  mutable std::optional<control::DaemonConnection> daemon_;  // read by const health checks
  std::unique_ptr<HostMemory> relay_memory_;
  std::unique_ptr<RelayReceiver> relay_;
  gpu_side::RingProducer* producer_ = nullptr;  // the session's, for ProducerState::waiting
  // Device memory the daemon registered as this rank's device staging (FI_HMEM); none else.
  gpu_side::device::SharedMemory device_staging_;
  std::string provider_;
  mutable std::optional<std::string> failure_;                     // the daemon's, once known
  mutable std::vector<std::optional<std::string>> peer_failures_;  // peers the daemon gave up
  uint32_t polls_since_socket_ = 0;
};

}  // namespace proxyep::proxy
