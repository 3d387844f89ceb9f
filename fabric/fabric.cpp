// Fabric: opens the rails of one rank, packs their addresses, registers memory on all of them.
//
// Address blob (little endian, common/wire.hpp):
//   u32 magic "PXFA" | u16 version | u16 rail count | per rail: u32 length, name bytes
// Every rank must open the same number of rails; rail i of one rank talks to rail i of another.
#include "fabric/fabric.hpp"

#include "common/log.hpp"
#include "common/params.hpp"
#include "common/wire.hpp"
#include "fabric/memory.hpp"
#include "fabric/provider.hpp"
#include "fabric/rail.hpp"
#include "fabric/reorder_shim.hpp"

#include <algorithm>

namespace proxyep::fabric {
namespace {

constexpr uint32_t kAddressMagic = 0x41465850;  // "PXFA" read as little-endian bytes
constexpr uint16_t kAddressVersion = 1;
constexpr size_t kMaxAddressBytes = 4096;  // libfabric names are tens of bytes

std::vector<Bytes> unpack_addresses(std::span<const uint8_t> blob, int rank) {
  std::string phase = "fabric.connect";
  ByteReader reader(blob, phase);
  uint32_t magic = reader.u32("magic");
  require(magic == kAddressMagic, phase,
          "the address blob of rank {} is not a fabric address "
          "(magic {:#010x})",
          rank, magic);
  uint16_t version = reader.u16("version");
  require(version == kAddressVersion, phase,
          "rank {} sent address version {} (this build "
          "reads {})",
          rank, version, kAddressVersion);
  uint16_t rails = reader.u16("rail count");
  std::vector<Bytes> names;
  for (uint16_t i = 0; i < rails; ++i) {
    uint32_t length = reader.u32("address length");
    require(length > 0 && length <= kMaxAddressBytes, phase, "rank {} rail {}: address of {} bytes",
            rank, i, length);
    auto bytes = reader.bytes(length, "address");
    names.emplace_back(bytes.begin(), bytes.end());
  }
  reader.expect_end("address blob");
  return names;
}

void validate(const FabricOptions& options) {
  require(options.rails >= 1, "fabric.open", "rails must be at least 1 (got {})", options.rails);
  require(options.cq_size >= 1 && options.cq_batch >= 1, "fabric.open",
          "cq_size and cq_batch must be positive (got {} and {})", options.cq_size,
          options.cq_batch);
  require(options.rank >= 0, "fabric.open", "rank must not be negative (got {})", options.rank);
  require(!options.reorder.enabled || options.reorder.segment_bytes >= 1, "fabric.open",
          "reorder segment_bytes must be positive");
}

class FabricImpl final : public Fabric {
 public:
  explicit FabricImpl(const FabricOptions& options) : options_(options) {
    validate(options_);
    for (InfoPtr& info : select_domains(options_.provider, options_.domain_filter, options_.rails))
      domains_.push_back(DomainContext::open(std::move(info)));
    for (int index = 0; index < options_.rails; ++index)
      open_rail(index);
    const Capabilities& caps = rails_[0].transport->capabilities();
    log::info("fabric: rank {} opened {} rail(s) on {} over {} domain(s) ({}), rail 0 at {}{}",
              options_.rank, options_.rails, caps.provider, domains_.size(), caps.domain_name,
              rails_[0].rail->address_text(), options_.reorder.enabled ? ", reorder shim on" : "");
  }

  const Capabilities& capabilities() const override { return rails_[0].transport->capabilities(); }
  int num_rails() const override { return static_cast<int>(rails_.size()); }
  Transport& rail(int index) override {
    require(index >= 0 && index < num_rails(), "fabric", "rail {} out of range ({} rails)", index,
            num_rails());
    return *rails_[static_cast<size_t>(index)].transport;
  }

  Bytes addresses() const override {
    Bytes blob;
    ByteWriter writer(blob);
    writer.u32(kAddressMagic);
    writer.u16(kAddressVersion);
    writer.u16(static_cast<uint16_t>(rails_.size()));
    for (const RailEntry& entry : rails_) {
      Bytes name = entry.transport->address();
      writer.u32(static_cast<uint32_t>(name.size()));
      writer.bytes(name);
    }
    return blob;
  }

  void connect(const std::vector<Bytes>& address_blobs_by_rank) override {
    const auto ranks = address_blobs_by_rank.size();
    require(static_cast<size_t>(options_.rank) < ranks, "fabric.connect",
            "{} address blobs, but this is rank {}", ranks, options_.rank);
    // A misordered allgather would send every write to the wrong rank: catch it here.
    require(address_blobs_by_rank[static_cast<size_t>(options_.rank)] == addresses(),
            "fabric.connect", "entry {} of the address list is not this rank's address",
            options_.rank);
    std::vector<std::vector<Bytes>> by_rail(rails_.size(), std::vector<Bytes>(ranks));
    for (size_t rank = 0; rank < ranks; ++rank) {
      std::vector<Bytes> names =
          unpack_addresses(address_blobs_by_rank[rank], static_cast<int>(rank));
      require(names.size() == rails_.size(), "fabric.connect",
              "rank {} opened {} rails, rank {} opened {}; every rank needs the same number", rank,
              names.size(), options_.rank, rails_.size());
      for (size_t rail = 0; rail < names.size(); ++rail)
        by_rail[rail][rank] = std::move(names[rail]);
    }
    for (size_t rail = 0; rail < rails_.size(); ++rail)
      rails_[rail].transport->connect(by_rail[rail]);
  }

  std::unique_ptr<MemoryRegion> register_memory(void* data, size_t size, MemoryKind kind) override {
    std::vector<Rail*> rails;
    for (const RailEntry& entry : rails_)
      rails.push_back(entry.rail);
    return register_region(rails, data, size, kind);
  }

  std::optional<ReorderStats> reorder_stats() const override {
    std::optional<ReorderStats> sum;
    for (const RailEntry& entry : rails_) {
      if (entry.shim == nullptr) continue;
      if (!sum) sum.emplace();
      *sum += entry.shim->stats();
    }
    return sum;
  }

  void open_connections(const std::vector<ConnectionProbe>& probes) override {
    for (const ConnectionProbe& probe : probes) {
      require(probe.rails.size() == rails_.size(), "fabric.connect",
              "the connection probe to rank {} names {} rail targets; rank {} has {} rails",
              probe.peer, probe.rails.size(), options_.rank, rails_.size());
      for (size_t rail = 0; rail < rails_.size(); ++rail)
        rails_[rail].rail->queue_probe(probe.peer, probe.rails[rail]);
    }
  }

  bool connections_open() override {
    for (RailEntry& entry : rails_)
      entry.rail->post_queued_probes();
    progress();  // every rail, every time: peers' probes may wait on any of this rank's rails
    return std::all_of(rails_.begin(), rails_.end(),
                       [](const RailEntry& entry) { return entry.rail->probes_done(); });
  }

  std::vector<int> peers_awaiting_connection() const override {
    std::vector<int> peers;
    for (const RailEntry& entry : rails_)
      for (int peer : entry.rail->peers_probed())
        peers.push_back(peer);
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    return peers;
  }

  void progress() override {
    for (RailEntry& entry : rails_) {
      if (entry.shim != nullptr)
        entry.shim->progress();
      else
        entry.rail->progress();
    }
  }

 private:
  struct RailEntry {
    // The rail itself, or the shim that owns it, or what options.wrap_rail made of either.
    std::unique_ptr<Transport> transport;
    Rail* rail = nullptr;
    ReorderShim* shim = nullptr;
  };

  // Rail i uses domain i mod D: with fewer NICs than rails, NICs carry several endpoints.
  void open_rail(int index) {
    RailOptions rail_options;
    rail_options.index = index;
    rail_options.rank = options_.rank;
    rail_options.cq_size = options_.cq_size;
    rail_options.cq_batch = options_.cq_batch;
    auto& domain = domains_[static_cast<size_t>(index) % domains_.size()];
    auto rail = std::make_unique<Rail>(domain, rail_options);
    RailEntry entry;
    entry.rail = rail.get();
    if (options_.reorder.enabled) {
      auto shim = std::make_unique<ReorderShim>(std::move(rail), options_.reorder, options_.rank);
      entry.shim = shim.get();
      entry.transport = std::move(shim);
    } else {
      entry.transport = std::move(rail);
    }
    if (options_.wrap_rail) {
      entry.transport = options_.wrap_rail(std::move(entry.transport));
      require(entry.transport != nullptr, "fabric.open",
              "wrap_rail returned no transport for rail {}", index);
    }
    rails_.push_back(std::move(entry));
  }

  FabricOptions options_;
  std::vector<std::shared_ptr<DomainContext>> domains_;
  std::vector<RailEntry> rails_;  // declared after domains_: rails close first
};

size_t positive(int64_t value, const config::ParamBase& param) {
  require(value > 0, "config", "{} ({}) must be positive, got {}", param.name(), param.env_name(),
          value);
  return static_cast<size_t>(value);
}

}  // namespace

ReorderStats& ReorderStats::operator+=(const ReorderStats& other) {
  writes += other.writes;
  split_writes += other.split_writes;
  segments += other.segments;
  segments_out_of_order += other.segments_out_of_order;
  remote_out_of_order += other.remote_out_of_order;
  local_out_of_order += other.local_out_of_order;
  return *this;
}

FabricOptions FabricOptions::from_params(int rank) {
  FabricOptions options;
  options.provider = params::fabric_provider.get();
  options.domain_filter = params::fabric_domain.get();
  options.rails = static_cast<int>(positive(params::fabric_rails.get(), params::fabric_rails));
  options.cq_size = positive(params::fabric_cq_size.get(), params::fabric_cq_size);
  options.cq_batch = positive(params::fabric_cq_batch.get(), params::fabric_cq_batch);
  options.rank = rank;
  options.reorder.enabled = params::fabric_reorder.get();
  options.reorder.seed = static_cast<uint64_t>(params::fabric_reorder_seed.get());
  options.reorder.segment_bytes =
      positive(params::fabric_reorder_segment_bytes.get(), params::fabric_reorder_segment_bytes);
  int64_t max_held = params::fabric_reorder_max_held.get();
  require(max_held >= 0, "config", "{} ({}) must not be negative, got {}",
          params::fabric_reorder_max_held.name(), params::fabric_reorder_max_held.env_name(),
          max_held);
  options.reorder.max_held = static_cast<size_t>(max_held);
  return options;
}

std::unique_ptr<Fabric> Fabric::open(const FabricOptions& options) {
  return std::make_unique<FabricImpl>(options);
}

}  // namespace proxyep::fabric
