// RankProxy: the proxy half of one rank. Its fabric endpoint, the memory registered there, the
// region table that names every rank's regions, and the engine whose threads drain the rank's
// descriptor rings into RMA writes. Two owners build the same thing:
//  - the in-process proxy host (proxy_host_in_process.hpp): proxy threads in the rank's own
//    process, the rank's memory registered where it lives;
//  - the node daemon's ServedRank (daemon/served_rank.hpp): the client's memory mapped from the
//    memfds it passed, its immediates relayed back to it.
// The steps follow the job's collective setup, which the owner drives:
//
//   RankProxy proxy(options, sink);                 // the fabric opens, the engine is made
//   proxy.register_rank_memory(arena, staging);     // region::kArena (target), region::kStaging
//   proxy.register_landing(landing, "auto");        // region::kLanding, where registering pays
//   proxy.register_device_memory(use, memory);      // FI_HMEM: device staging, arena, steps
//   proxy.add_ring(ring, &doorbell);                // every ring before start()
//   proxy.connect(addresses);                       // every rank's, after an allgather
//   proxy.add_regions(arenas, landings, devices);   // every rank's descriptors, checked
//   proxy.open_connections(peers); ...connections_open()
//   proxy.start();                                  // the threads drain the rings
//
// Isolation (what the daemon relies on): add_regions() checks every descriptor before anything
// enters the table (well formed, naming memory, this rank's own the one registered here, every
// arena as long as this rank's), so a client can only write from its own memory into its own
// job's arenas.
//
// Threads: every call from one thread (the owner's setup or protocol thread); the engine's
// threads run between start() and stop(). After stop(), abandoned() says whether a thread had
// to be left inside the provider: the owner must then keep alive whatever that thread may touch
// (this object, the sink, and the memory registered here) for the rest of the process.
#pragma once

#include "control/imm_sink.hpp"
#include "control/peer_watch.hpp"
#include "control/signal_words.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

struct RankProxyOptions {
  int rank = 0;
  int ranks = 0;
  fabric::FabricOptions fabric;  // its rank is overwritten
  EngineOptions engine;
  // The job's liveness where the owner has it (in process: the bootstrap's); null: none.
  const control::PeerWatch* peers = nullptr;
  std::string phase = "buffer";  // names every error of the setup
};

// What a piece of device memory registered with the fabric serves as.
enum class DeviceMemoryUse {
  staging,  // region::kDeviceStaging: a local source of chunks
  arena,    // region::kDeviceArena: the target of other nodes' device calls
  steps,    // region::kSteps: captured steps' memory (session/step_link.hpp)
};

class RankProxy {
 public:
  // Opens the fabric and makes the engine (not started); the engine routes completions into
  // `sink` (control/imm_sink.hpp: the rank's router in process, the relay to it in the node
  // daemon), which must outlive this object. Throws proxyep::Error from the fabric or for bad
  // options.
  RankProxy(RankProxyOptions options, control::ImmSink& sink);
  // Stops the engine; a thread it had to abandon keeps this object's fabric and engine alive.
  ~RankProxy();
  RankProxy(const RankProxy&) = delete;
  RankProxy& operator=(const RankProxy&) = delete;

  const fabric::Capabilities& capabilities() const { return fabric_->capabilities(); }
  fabric::Fabric& fabric() { return *fabric_; }
  ProxyEngine& engine() { return *engine_; }
  RegionTable& regions() { return engine_->regions(); }
  fabric::Bytes addresses() const { return fabric_->addresses(); }

  // The rank's arena (the peers' write target) and its staging area (the source of its chunks):
  // registered, and this rank's entries in the region table. Once, before add_regions().
  void register_rank_memory(std::span<std::byte> arena, std::span<std::byte> staging);
  // The caller's landing region (ep.landing_fabric `mode`): registered where
  // registers_landing(mode, provider) says so. Returns whether it is.
  bool register_landing(std::span<std::byte> landing, std::string_view mode);
  // Device memory the NIC reads and writes (FI_HMEM), registered for `use` while no proxy
  // thread is in a pass: "" once it is, else why not (no FI_HMEM, the provider refused that
  // memory: the owner's host memory serves). Replaces an earlier registration for `use` (of
  // step memory not linked yet).
  std::string register_device_memory(DeviceMemoryUse use, gpu_side::device::NicMemory memory);
  // Host memory for the captured steps, registered (replacing an earlier one not linked yet):
  // the region's descriptor.
  fabric::Bytes register_step_memory(std::span<std::byte> memory);
  // Drops the steps' registration (a rank failed to make its step memory).
  void drop_step_memory();
  // Every rank's step region under region::kSteps (by rank), and `words` counted by the
  // sink for every control immediate from now on; `keep_polling`: the threads poll instead of
  // sleeping from now on. Once, after the step memory was registered.
  void link_steps(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
                  bool keep_polling);
  bool steps_linked() const { return steps_linked_; }
  bool step_memory_on_device() const { return device_memory(DeviceMemoryUse::steps) != nullptr; }

  // Descriptors of what is registered, for the other ranks: nullopt where it is not.
  fabric::Bytes arena_descriptor() const;
  std::optional<fabric::Bytes> landing_descriptor() const;
  std::optional<fabric::Bytes> device_arena_descriptor() const;
  // The captured steps' memory's descriptor (host or device), once registered.
  std::optional<fabric::Bytes> step_descriptor() const;
  bool device_staging_registered() const { return region(DeviceMemoryUse::staging) != nullptr; }
  // The device memory registered for `use`, or null.
  std::byte* device_memory(DeviceMemoryUse use) const;

  // The rank's ring `ring` (its producers kick `doorbell`; null: the threads poll it). Before
  // start().
  void add_ring(const gpu_side::Ring& ring, const gpu_side::Doorbell* doorbell);
  // Every rank's fabric address (index = rank); this rank's must be its own. Once.
  void connect(const std::vector<fabric::Bytes>& addresses);
  // Every rank's arena descriptor, every rank's landing descriptor (exactly when this rank's
  // landing region is registered: every rank of a job decides alike), and every rank's device
  // arena descriptor (empty: that rank registered none; the whole list empty: no rank did).
  // Checked first (see Isolation above): a refused list leaves the table as it was.
  void add_regions(const std::vector<fabric::Bytes>& arenas,
                   const std::vector<fabric::Bytes>& landings,
                   const std::vector<fabric::Bytes>& device_arenas);
  // Probes the connection to each of `peers` (fabric_connections.hpp), after add_regions();
  // connections_open() drives them and says whether all completed (throws naming a failed one).
  void open_connections(const std::vector<int>& peers);
  bool connections_open();
  std::vector<int> peers_awaiting_connection() const;
  // Drives the fabric before start() (connection requests, early writes); nothing after.
  void progress();
  void start();
  bool started() const { return started_; }
  void stop() noexcept;
  bool abandoned() const { return engine_->abandoned(); }

 private:
  std::unique_ptr<fabric::MemoryRegion>& region(DeviceMemoryUse use);
  const fabric::MemoryRegion* region(DeviceMemoryUse use) const;

  RankProxyOptions options_;
  control::ImmSink& sink_;
  bool connected_ = false, started_ = false, steps_linked_ = false;
  // Everything the engine's threads may touch; leaked whole when stop() abandoned a thread.
  struct State {
    std::unique_ptr<fabric::Fabric> fabric;
    std::unique_ptr<fabric::MemoryRegion> arena, staging, landing, step_host;
    // Device memory by DeviceMemoryUse, and its registration.
    gpu_side::device::NicMemory device[3];
    std::unique_ptr<fabric::MemoryRegion> device_region[3];
    std::unique_ptr<ProxyEngine> engine;
  };
  std::unique_ptr<State> state_ = std::make_unique<State>();
  fabric::Fabric* fabric_ = nullptr;
  ProxyEngine* engine_ = nullptr;
};

// Whether the landing region is registered with the fabric: ep.landing_fabric `mode` (on, off,
// auto) for `provider`. Registration pins memory on efa and verbs (the whole region, however
// little of it outputs use), so auto is off there; on tcp, shm and the like it costs nothing.
bool registers_landing(std::string_view mode, std::string_view provider);

}  // namespace proxyep::proxy
