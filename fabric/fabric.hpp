// Fabric: the rails (NICs) of one rank and the memory registered on all of them. This is the
// entry point of the fabric layer: open it with options from the parameter registry, exchange
// addresses and region descriptors through the bootstrap, then drive writes on its rails.
//
//   auto fabric = Fabric::open(FabricOptions::from_params(rank));
//   auto addrs  = bootstrap.allgather(fabric->addresses());   // one blob per rank
//   fabric->connect(FabricAddresses::split(addrs));
//   auto region = fabric->register_memory(buf, len);
//   auto descs  = bootstrap.allgather(region->descriptor().serialize());
//   fabric->rail(0).write({...region->local_desc(0)..., peer_desc.target(0, offset)...});
#pragma once

#include "fabric/capabilities.hpp"
#include "fabric/region_descriptor.hpp"
#include "fabric/transport.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::fabric {

enum class MemoryKind : uint8_t { host, cuda };

struct ReorderOptions {
  bool enabled = false;
  uint64_t seed = 0;            // 0: derive from the clock and rank (logged)
  size_t segment_bytes = 4096;  // writes are split into segments of this size
  size_t max_held = 32;         // completions held back before one must be released
};

// What the reorder shim did (fabric/reorder_shim.hpp), so tests can prove it really reordered:
// a shim that delivers in order would let every ordering bug through the tests that rely on it.
struct ReorderStats {
  uint64_t writes = 0;                 // writes accepted
  uint64_t split_writes = 0;           // writes of more than one segment
  uint64_t segments = 0;               // segments posted
  uint64_t segments_out_of_order = 0;  // posted before a segment accepted earlier
  // Delivered to the user after the completion of a later write: remote ones per source rank
  // (by the source's write order), local ones by this rail's write order.
  uint64_t remote_out_of_order = 0;
  uint64_t local_out_of_order = 0;

  ReorderStats& operator+=(const ReorderStats& other);
};

struct FabricOptions {
  std::string provider = "auto";  // auto: efa when present, else shm
  std::string domain_filter;      // only domains whose name contains this
  int rails = 1;
  size_t cq_size = 16384;
  size_t cq_batch = 64;
  int rank = 0;  // for error messages and the shim's seed
  ReorderOptions reorder;
  // A decorator hook: when set, each rail's Transport (the reorder shim when on, else the
  // libfabric rail) is handed to it once, in rail order, while the Fabric opens, and rail(i)
  // returns what it gives back. It sits above the shim, so it sees every flag the caller sets
  // (the shim clears FI_MORE on the segments it posts). Tests interpose doubles here (e.g. a
  // doorbell provider that holds FI_MORE writes, tests/unit/fabric/doorbell_transport.hpp);
  // progress() still drives the rails beneath it, which a decorator sees only through poll().
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> wrap_rail;

  static FabricOptions from_params(int rank);  // fills every field from common/params.hpp
};

// A buffer registered on every rail; deregistered on destruction. It keeps the domains it is
// registered in alive, so it may outlive its Fabric.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  virtual MemoryKind kind() const = 0;
  virtual void* local_desc(int rail) const = 0;
  virtual RegionDescriptor descriptor() const = 0;
};

class Fabric {
 public:
  // Chooses the provider and domains, opens one fabric/domain/endpoint/CQ/AV per rail (wrapped
  // in the reorder shim when enabled, then in options.wrap_rail when set). Throws proxyep::Error
  // naming the provider on failure, listing the providers that do exist when the name is unknown.
  static std::unique_ptr<Fabric> open(const FabricOptions& options);
  virtual ~Fabric() = default;

  // Of rail 0 as the layer above sees it: with the reorder shim on, cq_data_size is 4 and
  // nothing is ordered (EFA's view), whatever the provider underneath offers.
  virtual const Capabilities& capabilities() const = 0;
  virtual int num_rails() const = 0;
  virtual Transport& rail(int index) = 0;

  // Addresses of all rails, concatenated into one blob for the bootstrap's allgather.
  virtual Bytes addresses() const = 0;
  // Takes every rank's blob (index = rank) and connects every rail.
  virtual void connect(const std::vector<Bytes>& address_blobs_by_rank) = 0;

  virtual std::unique_ptr<MemoryRegion> register_memory(void* data, size_t size,
                                                        MemoryKind kind = MemoryKind::host) = 0;
  // Summed over the rails: what the reorder shim did; nullopt when the shim is off. Safe from any
  // thread (monitoring; the counters a proxy thread is bumping may be a little behind).
  virtual std::optional<ReorderStats> reorder_stats() const = 0;
  // Connections opened before any data moves. Connection-oriented providers (tcp under
  // ofi_rxm) connect on a pair's first write, and when both ranks of a pair write to each other
  // for the first time at once, rxm can refuse one connection and then drop writes on the other
  // (seen at 256 ranks: a write never completed). So the session probes each pair from one side
  // only, before any call: one zero-length write without immediate data per rail to each peer in
  // `probes` (nothing completes at the target), at an address and key of a region the peer
  // registered. Probes are posted below the reorder shim and their completions never reach
  // rail()'s users. Then call connections_open() (it drives the rails) until it returns true;
  // it throws proxyep::Error("fabric.connect") naming the peer when a probe failed.
  // peers_awaiting_connection() names the peers still outstanding, for a deadline's message.
  struct ConnectionProbe {
    int peer = -1;
    std::vector<RemoteTarget> rails;  // the target on each rail (index = rail)
  };
  virtual void open_connections(const std::vector<ConnectionProbe>& probes) = 0;
  virtual bool connections_open() = 0;
  virtual std::vector<int> peers_awaiting_connection() const = 0;

  // Polls every rail once (for waits that must keep manual-progress providers moving);
  // completions found are buffered and returned by the next poll of that rail. Same thread as
  // the rails' users: rails may share a domain opened FI_THREAD_DOMAIN.
  virtual void progress() = 0;
};

}  // namespace proxyep::fabric
