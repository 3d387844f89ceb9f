// AttachedClient: a connection whose hello said `attach`: one rank of a job whose proxy is this
// daemon. It speaks the attach protocol (after the handshake of control/daemon_handshake.hpp),
// one request and one reply at a time, each a frame:
//
//   client -> {"proxyep":"attach","rank":r,"ranks":R,"tolerate_peer_failures":bool,
//              ["landing_fabric":"auto"],                  (only with a landing region)
//              ["device_ring":true],                       (a Buffer with a device)
//              ["step_ring":true],                         (... in a group across nodes)
//              ["device_memory":{"kind":"cuda",            (its device memory for the NIC)
//                                ["staging":{"handle":hex,"bytes":n,"fd":bool}],
//                                ["arena":{"handle":hex,"bytes":n,"fd":bool}]}]}
//             + descriptors: arena, staging, ring (memfds), doorbell (eventfd), relay (memfd),
//               [landing (memfd)], [device ring (memfd)], [step ring (memfd)],
//               [device staging], [device arena]
//               (the last two where "fd" says so: the simulated device's memfds)
//   daemon -> {"proxyep":"opened","addresses":hex,"arena":hex,"provider":"tcp;ofi_rxm",
//              ["landing":hex],                            (when it registered the landing region)
//              ["device_staging":bool],                    (whether it registered that)
//              ["device_arena":hex],                       (when it registered that)
//              ["device_memory_note":"why not"]}           (offered device memory left unused)
//   client -> {"proxyep":"connect","addresses":[hex, ...]}      (every rank's, by rank)
//   daemon -> {"proxyep":"connected"}
//   client -> {"proxyep":"arenas","descriptors":[hex, ...],["landing_descriptors":[hex, ...]],
//              ["device_arena_descriptors":[hex or "", ...]]}  ("": that rank registered none)
//   daemon -> {"proxyep":"arenas_added"}
//   client -> {"proxyep":"start"}
//   daemon -> {"proxyep":"started"}
//   ... (a client whose attach passed a "step_ring", at its first captured call:
//        proxy/session/proxy_host_daemon.hpp)
//   client -> {"proxyep":"step_memory","bytes":n,
//              ["device_memory":{"kind":k,"step":{"handle":hex,"bytes":n,"fd":bool}}]}
//             + the step memory's memfd, or the device memory's descriptor where "fd" says so
//   daemon -> {"proxyep":"step_memory_registered","region":hex | "note":"why not"}
//   client -> {"proxyep":"step_link","words":w,"descriptors":[hex, ...],"keep_polling":bool}
//             + the signal words' memfd
//   daemon -> {"proxyep":"step_linked"}
//   ... the proxy threads drain the client's ring until the client goes ...
//   client -> {"proxyep":"detach"}   daemon -> {"proxyep":"detached"}, or the client just closes
//
// Unprompted, the daemon may send {"proxyep":"peer_failure","rank":r,"phase":...,"message":...}
// (a peer given up under rank masking) and, when it stops serving the client,
// {"proxyep":"failure","phase":...,"message":...} (its proxy failed, the daemon is shutting
// down) before closing. A request the daemon cannot honour gets {"proxyep":"error","error":...}
// and the connection ends. When the connection ends for any reason (the client exited or was
// killed: the kernel closes its socket), the client's proxy threads stop and its memory is
// deregistered and unmapped (served_rank.hpp).
//
// Single-threaded: the daemon's poll loop calls everything.
#pragma once

#include "control/daemon_frames.hpp"
#include "control/tcp_socket.hpp"
#include "daemon/access_policy.hpp"
#include "daemon/served_rank.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::daemon {

class AttachedClient {
 public:
  // "" when the client may use `group` (every rank's fabric address); else why not.
  using GroupCheck =
      std::function<std::string(const AttachedClient& client, const std::vector<fabric::Bytes>&)>;

  AttachedClient(control::Socket socket, PeerCredentials peer, GroupCheck check_group);
  ~AttachedClient();
  AttachedClient(const AttachedClient&) = delete;
  AttachedClient& operator=(const AttachedClient&) = delete;

  int fd() const { return socket_.fd(); }
  const PeerCredentials& peer() const { return peer_; }
  // Null before the attach request and after the connection ended. Shared: the metrics
  // endpoint's thread may still read a rank's counters while the loop lets it go.
  const ServedRank* served() const { return served_.get(); }
  std::shared_ptr<const ServedRank> served_shared() const { return served_; }
  bool done() const { return !socket_.valid(); }
  // Attached and not started: the loop should call tick() often (fabric progress).
  bool in_setup() const { return served_ && !served_->started(); }
  bool running() const { return served_ && served_->started(); }

  // The socket is readable (or hung up): reads and answers requests.
  void on_readable();
  // Every turn of the loop: fabric progress during setup; a proxy failure or a peer given up is
  // reported to the client.
  void tick();
  // Tells the client why (a failure frame) and ends the connection.
  void end(std::string_view phase, std::string_view why);
  // Sends one frame now (the welcome, replies, notices); a client that does not take it is
  // dropped.
  void send(const nlohmann::json& message);

 private:
  void handle(const nlohmann::json& message);
  void attach(const nlohmann::json& message);
  // step_memory and step_link: captured steps (proxy/session/proxy_host_daemon.hpp), after start.
  void steps(const std::string& type, const nlohmann::json& message);
  void close_connection();
  void drop_passed_fds();

  control::Socket socket_;
  PeerCredentials peer_;
  GroupCheck check_group_;
  control::FrameDecoder decoder_;
  std::vector<int> passed_fds_;  // received with the latest bytes, until a request takes them
  std::shared_ptr<ServedRank> served_;
};

}  // namespace proxyep::daemon
