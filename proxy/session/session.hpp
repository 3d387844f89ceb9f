// Session: what a group of ranks needs to move bytes between them, behind one object. It owns
// the shared memory (this rank's arena, the node peers' arenas mapped here, the staging area),
// and, when the group spans nodes, the fabric, the registered regions, the descriptor ring, the
// proxy engine, the signal router, the counter bank, the sequence windows and the credits. It
// hands out one PeerChannel per rank (peer_channel.hpp) and the waits every protocol needs.
//
//   SessionConfig config{.sizes = {...}, .timeout = 8s};
//   auto session = Session::open(bootstrap, config);          // collective
//   session->begin_call(k, nullptr);                          // every call, on every rank
//   PeerChannel& to = session->channel(peer);                 // write records, eager, chunks
//   session->await({.ready = ..., .pending = ..., .phase = "dispatch", .what = "records"});
//   session->quiet("dispatch");                               // every write completed
//
// Where the proxy threads run is the one thing that differs, behind a ProxyHost (proxy_host.hpp):
// in this process (proxy_host_in_process.hpp), or in the node daemon (proxy_host_daemon.hpp: the
// channels post through a ring the daemon drains, and waits route the immediates the daemon
// relays back). Protocols above do not change.
//
// Threads: one protocol thread per session calls everything here; the proxy threads it runs
// are its own business.
#pragma once

#include "common/deadline.hpp"
#include "common/host_memory.hpp"
#include "common/step_clock.hpp"
#include "control/bootstrap.hpp"
#include "control/counter_bank.hpp"
#include "control/peer_watch.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/session/arena_layout.hpp"
#include "proxy/session/device_arenas.hpp"
#include "proxy/session/device_route_ring.hpp"
#include "proxy/session/fabric_channel.hpp"
#include "proxy/session/node_memory.hpp"
#include "proxy/session/peer_channel.hpp"
#include "proxy/session/step_link.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

struct SessionConfig {
  // ranks comes from the bootstrap; every other field must be the same on every rank (checked
  // when the session opens, naming the rank that differs).
  SessionSizes sizes;
  std::chrono::milliseconds timeout{100000};  // every wait's deadline (ep.timeout_ms)
  // How the fabric opens and the proxy runs when the group spans nodes; unset: from the
  // parameter registry (fabric.*, proxy.*). The rank in `fabric` is overwritten.
  std::optional<fabric::FabricOptions> fabric;
  std::optional<EngineOptions> engine;
  // Rank masking (low-latency calls with enable_shrink): the proxy gives up a failed or departed
  // peer alone instead of failing (EngineOptions::tolerate_peer_failures).
  bool tolerate_peer_failures = false;
  // The caller's landing region (integrations/normal/landing_zone.hpp), registered with the
  // fabric when the group spans nodes so other nodes' rows can be written straight into it
  // (PeerChannel::send_chunk_in_place); empty: none. `landing_fabric` (ep.landing_fabric): on,
  // off, or auto (on unless the provider pins what it registers: efa, verbs). Every rank
  // passes the same; the region must outlive the session.
  std::span<std::byte> landing;
  int landing_fd = -1;  // the landing region's memfd (a node daemon maps and registers it)
  std::string landing_fabric = "auto";
  // Whether a chunk that is a run of the caller's memory may be written straight from it
  // (PeerChannel::send_chunk_from; ep.send_from_x): only where the provider needs no
  // registration of a write's source (no FI_MR_LOCAL), whatever this says.
  bool send_from_caller = true;
  // The node daemon's socket when its proxy threads serve this rank (proxy.mode = daemon,
  // proxy_host_daemon.hpp); empty: proxy threads in this process. Only used when the group spans
  // nodes. Ranks may differ (each node has its own daemon).
  std::string daemon_socket;
  // The device of a Buffer's device calls (BufferOptions::device), or none. With one, when the
  // group spans nodes: a second ring its stream hands this rank's writes to other nodes into
  // (open_device_route), drained beside the first (by this process's proxy threads or the node
  // daemon's); and, with proxy threads in this process, where the fabric registers device memory
  // (FI_HMEM) and the device offers memory a NIC reads (DeviceRuntime::allocate_for_nic), a
  // device staging area its calls pack their chunks into, written from there (GPUDirect RDMA).
  // Without both, device calls' chunks bounce through the host staging area (registered with
  // the device). Its calls' rows to node peers go to their device arenas (device_arenas.hpp),
  // and, with FI_HMEM and proxy threads in this process, other nodes' device calls write theirs
  // into this rank's device arena. Ranks may differ.
  std::shared_ptr<gpu_side::device::DeviceRuntime> device;
  // Where opening the session marks its steps (options agreed, node memory, fabric, ...); none:
  // untimed. It must outlive Session::open.
  StepClock* setup_clock = nullptr;
};

// A wait of the protocol: until `ready()`, with the session's deadline. `pending(r)` says
// whether rank r is one it still waits for (named in the error; node peers among them are
// checked for liveness); `detail(r)`, when given, says where r stands (added to a timeout).
// `on_lost(r, why)`, when given, is offered every pending rank that is lost (peer_lost()) or
// still pending at the deadline: true means the caller gave it up (ready() no longer needs it)
// and the wait goes on; false fails the wait as without it.
struct Wait {
  std::function<bool()> ready;
  std::function<bool(int)> pending;
  std::string_view phase;
  std::string_view what;
  std::function<std::string(int)> detail;
  std::function<bool(int, const std::string&)> on_lost;
};

class ProxyHost;
struct HostOpened;

class Session {
 public:
  // Collective over `bootstrap` (which must outlive the session). Throws proxyep::Error for
  // options that differ between ranks, memory that cannot be shared, or a fabric that fails.
  static std::unique_ptr<Session> open(control::Bootstrap& bootstrap, const SessionConfig& config);

  // Use open(): `host` is where the proxy threads run (proxy_host.hpp), null on one node.
  Session(control::Bootstrap& bootstrap, const SessionConfig& config,
          std::unique_ptr<ProxyHost> host);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return layout_.rank(); }
  int ranks() const { return layout_.sizes().ranks; }
  int ranks_per_node() const { return layout_.sizes().ranks_per_node; }
  const ArenaLayout& layout() const { return layout_; }
  // The channel to `peer`; peer == rank(): to this rank's own arena (records to itself).
  PeerChannel& channel(int peer) const { return *state_->channels.at(static_cast<size_t>(peer)); }

  // Starts call `call` (0, 1, ...): signals of call - 2 are retired. `rows_device`: the device
  // whose kernels write and read the call's rows (its backend's stream; none for a host call);
  // in a call of SessionConfig::device, node peers' rows go through their device arenas
  // (device_arenas.hpp). Throws proxyep::Error when writes of an earlier call were left over
  // (the ranks are out of step).
  void begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device);
  // Waits as `wait` says; throws proxyep::Error(wait.phase) on timeout naming the pending ranks,
  // when a pending node peer exits, or when the transport failed.
  void await(const Wait& wait);
  // Waits until every write this rank posted has completed locally (staging may be rewritten).
  void quiet(std::string_view phase);
  // Throws proxyep::Error(phase) if the transport failed earlier (e.g. a proxy thread's peer).
  void check_health(std::string_view phase) const;
  // Why `rank` is known to be gone (it left the job, its process on this node exited, the proxy
  // gave it up), or nullopt.
  std::optional<std::string> peer_lost(int rank) const;
  // Rank masking: while ignored, the peer's signals are dropped whatever their call (a masked
  // peer that is only slow must not disturb later calls).
  void ignore_peer(int rank, bool ignored);
  // Stops the transport's threads; later calls may only be destruction. Idempotent.
  void stop() noexcept;
  // This rank's arena data area (sizes().data_bytes: where node peers' rows land) and staging
  // data area (sizes().staging_bytes: rows on their way to other nodes; empty on one node), for
  // callers that want the raw bytes (DeepEP's get_local_buffer_tensor). Both are rewritten by
  // every call.
  std::span<std::byte> data_area() const;
  std::span<std::byte> staging_data_area() const;
  // Every region of host memory a call's rows are written to or read from on this rank: its
  // arena, the node peers' arenas mapped here, its staging (when it has one). A device backend
  // registers them so that kernels pack and unpack rows there (integrations/device_regions.hpp).
  std::vector<std::span<std::byte>> row_memory() const;
  // Device calls. open_device_route(device) hands this rank's later writes to other nodes to
  // `device`'s stream (proxy/session/device_route.hpp): each is pushed to the proxies by the
  // stream, in order after the work queued on it before, so that the protocol posts a write whose
  // source a kernel is still filling without waiting for the kernel
  // (PeerChannel::posts_in_stream_order). close_device_route() ends that; the writes already handed
  // on stay the stream's. Returns whether the writes go through the stream: false without a device
  // ring (SessionConfig::device), on one node, for a null device (host tensors), or for a second
  // device (the first one's keeps the ring). Waits (await, quiet) first have the stream push what
  // it was handed.
  bool open_device_route(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                         std::string_view phase);
  void close_device_route() noexcept;
  // Queues the pushes of the writes handed to the stream since the last flush (one batch):
  // after a burst of writes, so that they leave as soon as the stream reaches them.
  void flush_device_route();
  // How many writes went through a device's stream (open_device_route) so far, how many payloads
  // (eager bytes, chunks) this rank stored into node peers' device arenas, and how many chunks
  // were written straight from device memory (the device staging area).
  uint64_t writes_from_device() const;
  uint64_t sends_to_device_arenas() const;
  uint64_t chunks_from_device_memory() const;

  // Steps a device's stream runs between nodes by itself (captured graphs: step_link.hpp):
  // collective, once per session, `bytes` of step memory and `words` signal words on every
  // rank, kept while the session lives, registered and counted by whichever proxy threads
  // serve the session (the host's). Throws proxyep::Error(phase): on one node, without a
  // device ring (SessionConfig::device), for a second open, or when a rank's memory or
  // registration fails.
  StepLink open_step_link(control::Bootstrap& bootstrap,
                          const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                          uint64_t bytes, uint32_t words, std::string_view phase);

  // One line for the debug log: sizes, paths, threads.
  std::string describe() const;
  // What the fabric's reorder shim (fabric.reorder, a testing aid) did, so a test can prove its
  // writes really were reordered; nullopt without a fabric in this process (one node, or the
  // daemon's) or with the shim off.
  std::optional<fabric::ReorderStats> reorder_stats() const;
  // Each proxy thread's counters (none without a fabric, or when they are the daemon's: its
  // metrics endpoint reports them), and whether the proxy failed: for the metrics endpoint,
  // from any thread while the session lives.
  std::vector<ThreadStats> proxy_thread_stats() const;
  bool proxy_failed() const;

 private:
  // The fabric path, when the group spans nodes: the host's collective setup (proxy_host.hpp).
  void open_fabric(control::Bootstrap& bootstrap, const SessionConfig& config);
  // Every rank's descriptors of what its host registered, to the host.
  // Returns, by rank, whether its device arena is a write target.
  std::vector<bool> share_regions(control::Bootstrap& bootstrap, const HostOpened& opened);
  // Until `ready()`: the host's wait, or (one node) polls; throws Error(phase) at the deadline.
  void wait_for(const std::function<bool()>& ready, const Deadline& deadline,
                std::string_view phase, const std::function<std::string()>& describe);
  // Has the device's stream push what the route was handed, before a wait for what answers it.
  void drive_device_route(std::string_view phase);
  // Stops the proxy threads; when one had to be left inside the provider, leaks the state it
  // may touch.
  void stop_and_settle() noexcept;

  ArenaLayout layout_;
  std::chrono::milliseconds timeout_;
  const control::PeerWatch* peers_;  // the bootstrap's liveness (null: a world of one)
  // Everything the proxy threads may touch, in construction order. When stop() had to leave a
  // thread inside the provider (ProxyHost::abandoned), the destructor leaks it whole: the
  // thread may return at any time and use the fabric, the router, the banks, the windows and
  // the registered memory.
  struct State {
    std::unique_ptr<NodeMemory> node;
    std::unique_ptr<DeviceArenas> device_arenas;  // SessionConfig::device's, for node peers
    // Records: key = source; eager bytes: key = R + source (fabric_channel.hpp).
    std::unique_ptr<control::CounterBank> counters;
    control::SignalRouter router;  // the rank's one router
    // The fabric path (only when the group spans nodes), in the host's memory.
    std::unique_ptr<HostMemory> staging, ring_memory;
    std::unique_ptr<gpu_side::Doorbell> doorbell;
    // SessionConfig::device: the ring a device's stream pushes into, and its route; the ring
    // its captured steps push into (step_link.hpp).
    std::unique_ptr<DeviceRouteRing> route_ring;
    std::unique_ptr<StepTransport> step;
    std::unique_ptr<ProxyHost> host;  // null on one node
    std::unique_ptr<gpu_side::RingProducer> producer;
    std::unique_ptr<FabricPoster> poster;
    // By rank: NodeChannel for this node's ranks (this rank included), FabricChannel for
    // others. The router points into the fabric channels: stop() ends the proxy threads first.
    std::vector<std::unique_ptr<PeerChannel>> channels;
  };
  std::unique_ptr<State> state_;  // made in the constructor, where ProxyHost is complete
};

// For the span of a call's writes to other nodes: hands them to `device`'s stream
// (Session::open_device_route), so that the protocol posts a chunk the moment its packing is
// queued rather than once it has run (the stream pushes the write to the proxies after the
// kernels before it). Off for a null device (host tensors), on one node, or where the session
// has no device ring; then the protocol waits for the packing before posting, as before.
// Leaving the scope hands the stream what was posted last and closes the route; a stream that
// fails that flush fails the call at its next wait (which drives the stream), so the error is
// only logged here.
class DeviceRouteScope {
 public:
  DeviceRouteScope(Session& session, const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                   std::string_view phase)
      : session_(session), on_(session.open_device_route(device, phase)) {}
  ~DeviceRouteScope();
  DeviceRouteScope(const DeviceRouteScope&) = delete;
  DeviceRouteScope& operator=(const DeviceRouteScope&) = delete;

 private:
  Session& session_;
  const bool on_;
};

}  // namespace proxyep::proxy
