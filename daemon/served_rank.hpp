// ServedRank: the data path the daemon runs for one attached client (one rank of a job): the
// client's memory mapped here, a fabric endpoint opened for it, its arena and staging registered
// there, and a proxy engine whose threads drain the client's descriptor ring and relay the
// immediates that arrive back to the client (proxy/engine/signal_relay.hpp). Built in steps that
// follow the client's own collective setup (proxy/session/proxy_host_daemon.hpp):
//
//   ServedRank rank(request, fds);  // maps, opens the fabric, registers: addresses(), arena()
//   rank.connect(addresses);        // every rank's fabric address, after the job's allgather
//   rank.add_arenas(descriptors);   // every rank's arena descriptor, after another allgather
//   rank.start();                   // the proxy threads start draining
//
// Device memory (client_device_memory.hpp): the client's device staging and device arena,
// opened through their handles where this fabric registers device memory, registered as
// region::kDeviceStaging (a local source) and region::kDeviceArena (every rank's, a
// remote target), so the NIC reads and writes GPU memory as in process.
//
// Memory: each region is this process's own mapping of the client's memfd, so when the client
// dies mid-call the pages stay valid until the rank is destroyed: writes in flight complete
// into and out of memory that still exists, and only then are the regions deregistered and
// unmapped.
//
// Isolation: the engine's region table holds this client's own regions and the descriptors its
// job exchanged; a descriptor names regions by index, so a client can only write from its own
// memory into its own job's arenas. Daemon::check_group() (daemon_accept.cpp) refuses an
// address list that names another job's rank on this daemon, and add_arenas() checks every
// descriptor before anything is registered (well formed, this rank's own the one it was given,
// the others as long as its own).
#pragma once

#include "common/host_memory.hpp"
#include "control/signal_words.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/doorbell.hpp"
#include "proxy/engine/health.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/engine/rank_proxy.hpp"
#include "proxy/engine/signal_relay.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::daemon {

// What an attach frame asks for ({"proxyep":"attach", ...}).
struct AttachRequest {
  int rank = 0;
  int ranks = 0;
  // The job's tag (control::daemon_job_tag: an HMAC under the job's secret), 64 hex digits, or
  // "" for a job without a secret. Ranks with different tags are of different jobs.
  std::string job_tag;
  bool tolerate_peer_failures = false;
  // ep.landing_fabric of the client, when it passed its landing region (the sixth descriptor):
  // registered as region::kLanding when registers_landing() says so for this fabric.
  std::string landing_fabric;
  // Whether the client passed a device ring (after the landing region, when it passed one): a
  // ring its device's stream pushes into (proxy/session/device_route_ring.hpp), drained beside the
  // first.
  bool device_ring = false;
  // Whether the client passed the ring its captured steps push into (after the device ring):
  // proxy/session/step_link.hpp, drained beside the others; their memory and words come later
  // (add_step_memory, link_steps).
  bool step_ring = false;
  // Device memory the client offers for the NIC (client_device_memory.hpp): registered when
  // this fabric registers device memory (FI_HMEM) and the memory opens here, else left to the
  // client's host bounce. Each comes with its descriptor (after the device ring) when with_fd.
  struct DeviceMemory {
    std::vector<uint8_t> handle;
    uint64_t bytes = 0;
    bool with_fd = false;
  };
  std::string device_kind;  // "cuda", "simulated"; empty: no device memory offered
  std::optional<DeviceMemory> device_staging;  // region::kDeviceStaging, local
  std::optional<DeviceMemory> device_arena;    // region::kDeviceArena, remote target
  // The descriptors that came with the frame, in this order: the five always, then landing,
  // device ring, step ring, device staging and device arena where present.
  enum Fd { arena, staging, ring, doorbell, relay, count };
  size_t fd_count() const;
};

class ServedRank {
 public:
  // Takes ownership of `fds` (AttachRequest::Fd order). Throws proxyep::Error("daemon.attach")
  // for memory that cannot be mapped, a ring that does not attach, or a fabric that fails.
  ServedRank(const AttachRequest& request, std::vector<int> fds);
  ~ServedRank();
  ServedRank(const ServedRank&) = delete;
  ServedRank& operator=(const ServedRank&) = delete;

  int rank() const { return request_.rank; }
  int ranks() const { return request_.ranks; }
  fabric::Bytes addresses() const { return state_->proxy->addresses(); }
  fabric::Bytes arena_descriptor() const { return state_->proxy->arena_descriptor(); }
  // The landing region's descriptor when it is registered, else nullopt.
  std::optional<fabric::Bytes> landing_descriptor() const {
    return state_->proxy->landing_descriptor();
  }
  // Whether the client's device staging is registered; its device arena's descriptor when that
  // is; why offered device memory is not used ("" when it all is, or none was offered).
  bool device_staging_registered() const { return state_->proxy->device_staging_registered(); }
  bool device_arena_registered() const { return device_arena_descriptor().has_value(); }
  std::optional<fabric::Bytes> device_arena_descriptor() const {
    return state_->proxy->device_arena_descriptor();
  }
  // What the client offered (AttachRequest): none when it has no device memory a NIC reads.
  bool offered_device_staging() const { return request_.device_staging.has_value(); }
  bool offered_device_arena() const { return request_.device_arena.has_value(); }
  const std::string& device_memory_note() const { return device_memory_note_; }
  const fabric::Capabilities& capabilities() const { return state_->proxy->capabilities(); }
  // The job's fabric addresses (index = rank), as connect() accepted them; empty before.
  const std::vector<fabric::Bytes>& group() const { return group_; }
  const std::string& job_tag() const { return request_.job_tag; }

  // The setup steps, as RankProxy's (proxy/engine/rank_proxy.hpp): every rank's fabric address;
  // every rank's arena, landing and device arena descriptors (checked there before anything is
  // registered); the connection probes, which the client polls (the daemon never blocks on one
  // rank while it serves others); the start.
  void connect(const std::vector<fabric::Bytes>& group);
  void add_arenas(const std::vector<fabric::Bytes>& descriptors,
                  const std::vector<fabric::Bytes>& landing_descriptors,
                  const std::vector<fabric::Bytes>& device_arena_descriptors) {
    state_->proxy->add_regions(descriptors, landing_descriptors, device_arena_descriptors);
  }
  void open_connections(const std::vector<int>& peers) { state_->proxy->open_connections(peers); }
  bool connections_open() { return state_->proxy->connections_open(); }
  std::vector<int> peers_awaiting_connection() const {
    return state_->proxy->peers_awaiting_connection();
  }
  void start() { state_->proxy->start(); }
  bool started() const { return state_->proxy->started(); }
  // Before start(): the client's collectives wait on its peers, whose fabric needs this side
  // to progress (connection requests, early writes).
  void progress() { state_->proxy->progress(); }

  // Captured steps (proxy/session/step_link.hpp, proxy/session/proxy_host_daemon.hpp), after
  // start(): the client's step memory, its memfd `fd` (host memory) or, with `device`, its device
  // memory by handle (and `fd` where the device has one), registered (replacing one not linked
  // yet). Returns the region's descriptor; nullopt for device memory this fabric does not register,
  // with why in `note` (the client's host memory then serves). Throws
  // proxyep::Error("daemon.steps").
  std::optional<fabric::Bytes> add_step_memory(
      uint64_t bytes, const std::optional<AttachRequest::DeviceMemory>& device,
      const std::string& device_kind, int fd, std::string& note);
  // Every rank's step region (by rank), and the client's signal words (the memfd `words_fd` of
  // `words` words), which the daemon counts from now on; `keep_polling`: the proxy threads stop
  // sleeping. Once.
  void link_steps(const std::vector<fabric::Bytes>& descriptors, int words_fd, uint32_t words,
                  bool keep_polling);
  bool steps_linked() const { return state_->proxy->steps_linked(); }
  bool step_memory_on_device() const { return state_->proxy->step_memory_on_device(); }

  std::optional<proxy::Failure> failure() const;
  // Peers given up under tolerate_peer_failures, not reported before (each once).
  std::vector<std::pair<int, proxy::Failure>> new_peer_failures();
  // Each proxy thread's counters (CPU time included), from any thread while the rank lives.
  std::vector<proxy::ThreadStats> thread_stats() const;
  uint64_t relayed() const { return state_->relay ? state_->relay->relayed() : 0; }

 private:
  // Opens the client's device memory `offer` (of device `kind`) and registers it for `use`
  // (FI_HMEM): "" when it is, else why not (the client's host memory then serves).
  std::string open_device_memory(proxy::DeviceMemoryUse use, const std::string& kind,
                                 const AttachRequest::DeviceMemory& offer, int fd);
  // open_device_memory() for the attach's offers; the reason in device_memory_note_ where it is
  // not registered.
  void register_device_memory(proxy::DeviceMemoryUse use, const AttachRequest::DeviceMemory& offer,
                              int fd);

  AttachRequest request_;
  std::vector<fabric::Bytes> group_;
  std::vector<bool> peer_failure_reported_;
  std::string device_memory_note_;
  // Everything the proxy threads may touch; leaked whole when stop() had to abandon a thread.
  struct State {
    // The client's memory, mapped here.
    std::unique_ptr<HostMemory> arena, staging, ring_memory, relay_memory, landing,
        device_ring_memory, step_ring_memory, step_memory;
    std::unique_ptr<control::SignalWords> step_words;  // the captured steps', counted here
    std::unique_ptr<gpu_side::Doorbell> doorbell;
    // The proxy's sink: relays to the client's router, counts only the step words.
    std::unique_ptr<proxy::RelaySender> relay;
    std::unique_ptr<proxy::RankProxy> proxy;
  };
  std::unique_ptr<State> state_ = std::make_unique<State>();
};

}  // namespace proxyep::daemon
