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
// Kinds: the in-process session (proxy threads of this process, in_process_session.hpp), and
// the node daemon's client (daemon_session.hpp: the channels post through a ring the daemon
// drains, and waits route the immediates the daemon relays back). Protocols above do not change.
//
// Threads: one protocol thread per session calls everything here; the proxy threads it runs
// are its own business.
#pragma once

#include "common/step_clock.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "proxy/arena_layout.hpp"
#include "proxy/peer_channel.hpp"
#include "proxy/proxy_engine.hpp"
#include "proxy/step_link.hpp"

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
  // daemon_session.hpp); empty: proxy threads in this process. Only used when the group spans
  // nodes. Ranks may differ (each node has its own daemon).
  std::string daemon_socket;
  // The device of a Buffer's device calls (BufferOptions::device), or none. With one, when the
  // group spans nodes: a second ring its stream hands this rank's writes to other nodes into
  // (route_posts), drained beside the first (by this process's proxy threads or the node
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

// Whether the landing region is registered with the fabric: ep.landing_fabric `mode` (on, off,
// auto) for `provider`. Registration pins memory on efa and verbs (the whole region, however
// little of it outputs use), so auto is off there; on tcp, shm and the like it costs nothing.
bool registers_landing(std::string_view mode, std::string_view provider);

class Session {
 public:
  // Collective over `bootstrap` (which must outlive the session). Throws proxyep::Error for
  // options that differ between ranks, memory that cannot be shared, or a fabric that fails.
  static std::unique_ptr<Session> open(control::Bootstrap& bootstrap, const SessionConfig& config);

  virtual ~Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return layout_.rank(); }
  int ranks() const { return layout_.sizes().ranks; }
  int ranks_per_node() const { return layout_.sizes().ranks_per_node; }
  const ArenaLayout& layout() const { return layout_; }
  // The channel to `peer`; peer == rank(): to this rank's own arena (records to itself).
  virtual PeerChannel& channel(int peer) const = 0;

  // Starts call `call` (0, 1, ...): signals of call - 2 are retired. `rows_device`: the device
  // whose kernels write and read the call's rows (its backend's stream; none for a host call);
  // in a call of SessionConfig::device, node peers' rows go through their device arenas
  // (device_arenas.hpp). Throws proxyep::Error when writes of an earlier call were left over
  // (the ranks are out of step).
  virtual void begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device) = 0;
  // Waits as `wait` says; throws proxyep::Error(wait.phase) on timeout naming the pending ranks,
  // when a pending node peer exits, or when the transport failed.
  virtual void await(const Wait& wait) = 0;
  // Waits until every write this rank posted has completed locally (staging may be rewritten).
  virtual void quiet(std::string_view phase) = 0;
  // Throws proxyep::Error(phase) if the transport failed earlier (e.g. a proxy thread's peer).
  virtual void check_health(std::string_view phase) const = 0;
  // Why `rank` is known to be gone (it left the job, its process on this node exited, the proxy
  // gave it up), or nullopt.
  virtual std::optional<std::string> peer_lost(int rank) const = 0;
  // Rank masking: while ignored, the peer's signals are dropped whatever their call (a masked
  // peer that is only slow must not disturb later calls).
  virtual void ignore_peer(int rank, bool ignored) = 0;
  // Stops the transport's threads; later calls may only be destruction. Idempotent.
  virtual void stop() noexcept = 0;
  // This rank's arena data area (sizes().data_bytes: where node peers' rows land) and staging
  // data area (sizes().staging_bytes: rows on their way to other nodes; empty on one node), for
  // callers that want the raw bytes (DeepEP's get_local_buffer_tensor). Both are rewritten by
  // every call.
  virtual std::span<std::byte> data_area() const = 0;
  virtual std::span<std::byte> staging_data_area() const = 0;
  // Every region of host memory a call's rows are written to or read from on this rank: its
  // arena, the node peers' arenas mapped here, its staging (when it has one). A device backend
  // registers them so that kernels pack and unpack rows there (integrations/device_regions.hpp).
  virtual std::vector<std::span<std::byte>> row_memory() const = 0;
  // Device calls. route_posts(device) hands this rank's later writes to other nodes to
  // `device`'s stream (proxy/device_route.hpp): each is pushed to the proxies by the stream, in
  // order after the work queued on it before, so that the protocol posts a write whose source a
  // kernel is still filling without waiting for the kernel (PeerChannel::posts_in_stream_order).
  // route_posts(nullptr) ends that (noexcept); the writes already handed on stay the stream's.
  // Returns whether the writes go through the stream: false without a device ring
  // (SessionConfig::device), on one node, or for a second device (the first one's keeps the
  // ring). Waits (await, quiet) first have the stream push what it was handed.
  virtual bool route_posts(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                           std::string_view phase) {
    (void)device, (void)phase;
    return false;
  }
  // Queues the pushes of the writes handed to the stream since the last flush (one batch):
  // after a burst of writes, so that they leave as soon as the stream reaches them.
  virtual void flush_posts() {}
  // How many writes went through a device's stream (route_posts) so far, and how many of them
  // were chunks written straight from device memory (the device staging area).
  virtual uint64_t writes_from_device() const { return 0; }
  // How many payloads (eager bytes, chunks) this rank stored into node peers' device arenas.
  virtual uint64_t sends_to_device_arenas() const = 0;
  virtual uint64_t chunks_from_device_memory() const { return 0; }

  // Steps a device's stream runs between nodes by itself (captured graphs: step_link.hpp):
  // collective, once per session, `bytes` of step memory and `words` signal words on every
  // rank, kept while the session lives, registered and counted by whichever proxy threads
  // serve the session (this process's, or the node daemon's: daemon_steps.hpp). Throws
  // proxyep::Error(phase): on one node, without a device ring (SessionConfig::device), for a
  // second open, or when a rank's memory or registration fails.
  virtual StepLink open_step_link(control::Bootstrap& bootstrap,
                                  const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  uint64_t bytes, uint32_t words, std::string_view phase) = 0;

  // One line for the debug log: sizes, paths, threads.
  virtual std::string describe() const = 0;
  // What the fabric's reorder shim (fabric.reorder, a testing aid) did, so a test can prove its
  // writes really were reordered; nullopt without a fabric (one node) or with the shim off.
  virtual std::optional<fabric::ReorderStats> reorder_stats() const = 0;
  // Each proxy thread's counters (none without a fabric), and whether the proxy failed: for the
  // metrics endpoint, from any thread while the session lives.
  virtual std::vector<ThreadStats> proxy_thread_stats() const = 0;
  virtual bool proxy_failed() const = 0;

 protected:
  explicit Session(ArenaLayout layout) : layout_(std::move(layout)) {}

 private:
  ArenaLayout layout_;
};

}  // namespace proxyep::proxy
