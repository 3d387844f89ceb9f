// The proxy half of one rank (rank_proxy.hpp).
#include "proxy/engine/rank_proxy.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "control/imm_layout.hpp"
#include "fabric/shm_stale.hpp"
#include "proxy/engine/fabric_connections.hpp"
#include "proxy/engine/region_ids.hpp"

#include <fmt/format.h>

#include <chrono>

namespace proxyep::proxy {

namespace {

// How long a change of the region table waits for the proxy threads to finish their passes
// (ProxyEngine::amend): a thread stuck inside the provider fails it rather than the caller.
constexpr std::chrono::seconds kAmendTimeout{10};

size_t slot(DeviceMemoryUse use) {
  return static_cast<size_t>(use);
}

const char* use_name(DeviceMemoryUse use) {
  switch (use) {
    case DeviceMemoryUse::staging:
      return "device staging";
    case DeviceMemoryUse::arena:
      return "device arena";
    case DeviceMemoryUse::steps:
      return "step memory";
  }
  return "?";
}

// The region lists add_regions() takes.
enum class Descriptors { arena, landing, device_arena };

// `serialized` (one per rank) deserialized, after the checks add_regions() promises: each well
// formed and naming memory, this rank's own equal to `own` (what it registered; none: empty),
// every arena as long as this rank's. nullopt where a rank sent none (only a device arena may
// be missing). Throws proxyep::Error(phase) naming the rank and the list.
std::vector<std::optional<fabric::RegionDescriptor>> checked_descriptors(
    Descriptors which, const std::vector<fabric::Bytes>& serialized,
    const std::optional<fabric::Bytes>& own, size_t own_rank, const std::string& phase) {
  const std::string_view kind = which == Descriptors::arena     ? "arena"
                                : which == Descriptors::landing ? "landing"
                                                                : "device arena";
  // This rank's own entry must be the region registered here, byte for byte: a client cannot
  // point its own rank's writes at memory it was not given.
  require(own.has_value() ? serialized[own_rank] == *own : serialized[own_rank].empty(), phase,
          "rank {}'s {} descriptor is not the one registered for it here", own_rank, kind);
  std::optional<fabric::RegionDescriptor> mine;
  if (own) mine = fabric::RegionDescriptor::deserialize(*own);
  std::vector<std::optional<fabric::RegionDescriptor>> out(serialized.size());
  for (size_t r = 0; r < serialized.size(); ++r) {
    if (serialized[r].empty()) {
      require(which == Descriptors::device_arena, phase, "rank {}'s {} descriptor is empty", r,
              kind);
      continue;
    }
    try {
      out[r] = fabric::RegionDescriptor::deserialize(serialized[r]);
    } catch (const std::exception& e) {
      fail(phase, "rank {}'s {} descriptor is malformed: {}", r, kind, e.what());
    }
    require(!out[r]->rails.empty() && out[r]->length > 0, phase,
            "rank {}'s {} descriptor names no memory ({} bytes on {} rails)", r, kind,
            out[r]->length, out[r]->rails.size());
    // Every rank's arena has the one layout the job agreed on (arena_layout.hpp), so a longer
    // one is a lie about the peer's memory, and a shorter one a broken launch.
    if (which == Descriptors::arena && mine)
      require(out[r]->length == mine->length, phase,
              "rank {}'s {} descriptor is {} bytes long; every rank's is {} (this one's)", r, kind,
              out[r]->length, mine->length);
  }
  return out;
}

}  // namespace

bool registers_landing(std::string_view mode, std::string_view provider) {
  if (mode != "auto") return mode == "on";
  return provider.find("efa") == std::string_view::npos &&
         provider.find("verbs") == std::string_view::npos;
}

RankProxy::RankProxy(RankProxyOptions options, control::ImmSink& sink)
    : options_(std::move(options)), sink_(sink) {
  require(options_.ranks >= 1 && options_.rank >= 0 && options_.rank < options_.ranks,
          options_.phase, "rank {} of {} ranks", options_.rank, options_.ranks);
  require(static_cast<uint32_t>(options_.ranks) <= control::imm::kMaxStreams, options_.phase,
          "{} ranks exceed the {} chunk streams an immediate can name", options_.ranks,
          control::imm::kMaxStreams);
  options_.fabric.rank = options_.rank;
  State& s = *state_;
  s.fabric = fabric::Fabric::open(options_.fabric);
  fabric_ = s.fabric.get();
  s.engine = std::make_unique<ProxyEngine>(*s.fabric, options_.rank, options_.ranks, sink_,
                                           options_.engine);
  s.engine->watch_peers(options_.peers);
  engine_ = s.engine.get();
}

RankProxy::~RankProxy() {
  stop();
  if (!engine_->abandoned()) return;
  log::warn(
      "{}: a proxy thread of rank {} is stuck inside the fabric provider; its fabric and "
      "registrations are kept for the life of the process",
      options_.phase, options_.rank);
  (void)keep_forever(std::move(state_));
  fabric::remove_own_shm_regions_at_exit();  // the abandoned shm endpoints' regions
}

void RankProxy::stop() noexcept {
  engine_->stop();
}

void RankProxy::register_rank_memory(std::span<std::byte> arena, std::span<std::byte> staging) {
  State& s = *state_;
  require(s.arena == nullptr, options_.phase, "the rank's memory is registered once");
  s.arena = s.fabric->register_memory(arena.data(), arena.size());
  s.staging = s.fabric->register_memory(staging.data(), staging.size());
  regions().add_local(region::kArena, *s.arena);
  regions().add_local(region::kStaging, *s.staging);
}

bool RankProxy::register_landing(std::span<std::byte> landing, std::string_view mode) {
  if (landing.empty() || !registers_landing(mode, capabilities().provider)) return false;
  state_->landing = fabric_->register_memory(landing.data(), landing.size());
  regions().add_local(region::kLanding, *state_->landing);
  return true;
}

std::unique_ptr<fabric::MemoryRegion>& RankProxy::region(DeviceMemoryUse use) {
  return state_->device_region[slot(use)];
}

const fabric::MemoryRegion* RankProxy::region(DeviceMemoryUse use) const {
  return state_->device_region[slot(use)].get();
}

std::byte* RankProxy::device_memory(DeviceMemoryUse use) const {
  return region(use) != nullptr ? state_->device[slot(use)].memory.get() : nullptr;
}

std::string RankProxy::register_device_memory(DeviceMemoryUse use,
                                              gpu_side::device::NicMemory memory) {
  // Chosen from the capabilities alone: without FI_HMEM, or where the provider refuses this
  // memory (a libfabric built without CUDA announces FI_HMEM and refuses CUDA memory), the
  // owner's host memory serves.
  if (!capabilities().hmem)
    return fmt::format("provider {} does not register device memory (no FI_HMEM)",
                       capabilities().provider);
  require(!(use == DeviceMemoryUse::steps && steps_linked_), options_.phase,
          "step memory is registered before the steps are linked");
  State& s = *state_;
  try {
    engine_->amend(
        [&] {
          if (use == DeviceMemoryUse::steps) s.step_host.reset();
          region(use) = fabric_->register_memory(
              memory.memory.get(), memory.bytes,
              memory.registers_as_host ? fabric::MemoryKind::host : fabric::MemoryKind::cuda);
        },
        Deadline(kAmendTimeout));
  } catch (const Error& e) {
    log::info("{}: rank {}: {} not registered ({}); host memory serves", options_.phase,
              options_.rank, use_name(use), e.what());
    return e.what();
  }
  s.device[slot(use)] = std::move(memory);
  if (use == DeviceMemoryUse::staging) regions().add_local(region::kDeviceStaging, *region(use));
  return {};
}

fabric::Bytes RankProxy::register_step_memory(std::span<std::byte> memory) {
  require(!steps_linked_, options_.phase, "step memory is registered before the steps are linked");
  State& s = *state_;
  engine_->amend(
      [&] {
        region(DeviceMemoryUse::steps).reset();
        s.step_host = fabric_->register_memory(memory.data(), memory.size());
      },
      Deadline(kAmendTimeout));
  s.device[slot(DeviceMemoryUse::steps)] = {};
  return s.step_host->descriptor().serialize();
}

void RankProxy::drop_step_memory() {
  State& s = *state_;
  engine_->amend(
      [&] {
        s.step_host.reset();
        region(DeviceMemoryUse::steps).reset();
      },
      Deadline(kAmendTimeout));
  s.device[slot(DeviceMemoryUse::steps)] = {};
}

void RankProxy::link_steps(const std::vector<fabric::Bytes>& descriptors,
                           control::SignalWords& words, bool keep_polling) {
  State& s = *state_;
  const fabric::MemoryRegion* own =
      s.step_host ? s.step_host.get() : region(DeviceMemoryUse::steps).get();
  require(own != nullptr && !steps_linked_, options_.phase,
          "the steps are linked once, after their memory was registered");
  require(descriptors.size() == static_cast<size_t>(options_.ranks), options_.phase,
          "{} step region descriptors for a job of {} ranks", descriptors.size(), options_.ranks);
  engine_->amend(
      [&] {
        regions().add_local(region::kSteps, *own);
        for (int r = 0; r < options_.ranks; ++r)
          regions().add_remote(
              r, region::kSteps,
              fabric::RegionDescriptor::deserialize(descriptors[static_cast<size_t>(r)]));
        sink_.attach_words(words);
      },
      Deadline(kAmendTimeout));
  steps_linked_ = true;
  if (keep_polling) engine_->keep_polling(true);
}

fabric::Bytes RankProxy::arena_descriptor() const {
  require(state_->arena != nullptr, options_.phase, "the rank's memory is not registered");
  return state_->arena->descriptor().serialize();
}

std::optional<fabric::Bytes> RankProxy::landing_descriptor() const {
  if (!state_->landing) return std::nullopt;
  return state_->landing->descriptor().serialize();
}

std::optional<fabric::Bytes> RankProxy::device_arena_descriptor() const {
  const fabric::MemoryRegion* arena = region(DeviceMemoryUse::arena);
  if (arena == nullptr) return std::nullopt;
  return arena->descriptor().serialize();
}

std::optional<fabric::Bytes> RankProxy::step_descriptor() const {
  const fabric::MemoryRegion* step =
      state_->step_host ? state_->step_host.get() : region(DeviceMemoryUse::steps);
  if (step == nullptr) return std::nullopt;
  return step->descriptor().serialize();
}

void RankProxy::add_ring(const gpu_side::Ring& ring, const gpu_side::Doorbell* doorbell) {
  require(!started_, options_.phase, "rings are added before the proxy starts");
  engine_->add_ring(ring, doorbell);
}

void RankProxy::connect(const std::vector<fabric::Bytes>& addresses) {
  require(!connected_, options_.phase, "rank {} asked to connect twice", options_.rank);
  require(addresses.size() == static_cast<size_t>(options_.ranks), options_.phase,
          "{} fabric addresses for a job of {} ranks", addresses.size(), options_.ranks);
  require(addresses[static_cast<size_t>(options_.rank)] == this->addresses(), options_.phase,
          "the address list names another endpoint as rank {} (this one's own)", options_.rank);
  fabric_->connect(addresses);
  connected_ = true;
}

void RankProxy::add_regions(const std::vector<fabric::Bytes>& arenas,
                            const std::vector<fabric::Bytes>& landings,
                            const std::vector<fabric::Bytes>& device_arenas) {
  const std::string& phase = options_.phase;
  require(connected_ && !started_, phase, "region descriptors come after connect, before start");
  require(arenas.size() == static_cast<size_t>(options_.ranks), phase,
          "{} arena descriptors for a job of {} ranks", arenas.size(), options_.ranks);
  const bool landing = state_->landing != nullptr;
  require(landings.size() == (landing ? arenas.size() : 0u), phase,
          "{} landing descriptors for a job of {} ranks (this rank's landing region is {})",
          landings.size(), options_.ranks, landing ? "registered" : "not registered");
  require(device_arenas.empty() || device_arenas.size() == arenas.size(), phase,
          "{} device arena descriptors for a job of {} ranks", device_arenas.size(),
          options_.ranks);
  const auto own = static_cast<size_t>(options_.rank);
  // Every descriptor is checked before anything enters the table.
  const auto arena_of =
      checked_descriptors(Descriptors::arena, arenas, arena_descriptor(), own, phase);
  const auto landing_of = landing ? checked_descriptors(Descriptors::landing, landings,
                                                        landing_descriptor(), own, phase)
                                  : std::vector<std::optional<fabric::RegionDescriptor>>{};
  const auto device_arena_of = device_arenas.empty()
                                   ? std::vector<std::optional<fabric::RegionDescriptor>>{}
                                   : checked_descriptors(Descriptors::device_arena, device_arenas,
                                                         device_arena_descriptor(), own, phase);
  for (int r = 0; r < options_.ranks; ++r) {
    const auto i = static_cast<size_t>(r);
    regions().add_remote(r, region::kArena, *arena_of[i]);
    if (landing) regions().add_remote(r, region::kLanding, *landing_of[i]);
    // Empty: rank r registered no device arena; nothing is sent there.
    if (!device_arena_of.empty() && device_arena_of[i])
      regions().add_remote(r, region::kDeviceArena, *device_arena_of[i]);
  }
}

void RankProxy::open_connections(const std::vector<int>& peers) {
  require(connected_ && !started_, options_.phase, "connections open after connect, before start");
  for (int peer : peers)
    require(peer >= 0 && peer < options_.ranks && peer != options_.rank, options_.phase,
            "rank {} asked for a connection to rank {} (a job of {} ranks)", options_.rank, peer,
            options_.ranks);
  fabric_->open_connections(connection_probes(regions(), peers, options_.phase));
}

bool RankProxy::connections_open() {
  require(!started_, options_.phase, "connections open before start");
  return fabric_->connections_open();
}

std::vector<int> RankProxy::peers_awaiting_connection() const {
  return fabric_->peers_awaiting_connection();
}

void RankProxy::progress() {
  if (!started_) fabric_->progress();
}

void RankProxy::start() {
  require(connected_ && !started_, options_.phase, "start comes once, after connect");
  engine_->start();
  started_ = true;
}

}  // namespace proxyep::proxy
