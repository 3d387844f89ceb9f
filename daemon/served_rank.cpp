// The daemon's data path for one client (served_rank.hpp).
#include "daemon/served_rank.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "control/imm_layout.hpp"
#include "daemon/client_device_memory.hpp"
#include "fabric/shm_stale.hpp"
#include "proxy/fabric_channel.hpp"
#include "proxy/fabric_connections.hpp"
#include "proxy/session.hpp"
#include "proxy/step_link.hpp"

#include <fmt/format.h>
#include <unistd.h>

namespace proxyep::daemon {

namespace {

constexpr const char* kPhase = "daemon.attach";

constexpr const char* kStepPhase = "daemon.steps";
// How long a change of the region table waits for the proxy threads to finish their passes
// (ProxyEngine::amend): a thread stuck inside the provider fails it rather than the loop.
constexpr std::chrono::seconds kAmendTimeout{10};

constexpr size_t kNoFd = ~size_t{0};

// The descriptor at `position` (kNoFd: none came).
int fd_at(const std::vector<int>& fds, size_t position) {
  return position == kNoFd ? -1 : fds[position];
}

std::unique_ptr<HostMemory> map_client_fd(int fd, const char* what) {
  try {
    return std::make_unique<HostMemory>(HostMemory::map_fd(fd));
  } catch (const Error& e) {
    fail(kPhase, "cannot map the client's {}: {}", what, e.what());
  }
}

}  // namespace

size_t AttachRequest::fd_count() const {
  auto with = [](bool present) { return present ? size_t{1} : size_t{0}; };
  return count + with(!landing_fabric.empty()) + with(device_ring) + with(step_ring) +
         with(device_staging && device_staging->with_fd) +
         with(device_arena && device_arena->with_fd);
}

ServedRank::ServedRank(const AttachRequest& request, std::vector<int> fds) : request_(request) {
  // Whatever happens, the received descriptors are closed here: the mappings keep the memory.
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
    }
  } close_all{fds};
  const bool with_landing = !request.landing_fabric.empty();
  const auto with_fd = [](const std::optional<AttachRequest::DeviceMemory>& memory) {
    return memory && memory->with_fd;
  };
  require(fds.size() == request.fd_count(), kPhase,
          "the attach frame carried {} file descriptors, {} expected (arena, staging, ring, "
          "doorbell, relay{}{}{}{}{})",
          fds.size(), request.fd_count(), with_landing ? ", landing" : "",
          request.device_ring ? ", device ring" : "", request.step_ring ? ", step ring" : "",
          with_fd(request.device_staging) ? ", device staging" : "",
          with_fd(request.device_arena) ? ", device arena" : "");
  require(request.ranks >= 2 && request.rank >= 0 && request.rank < request.ranks, kPhase,
          "rank {} of {} ranks: a rank between 0 and ranks - 1, at least 2 ranks", request.rank,
          request.ranks);
  require(static_cast<uint32_t>(request.ranks) <= control::imm::kMaxStreams, kPhase,
          "a job of {} ranks: an immediate names at most {} (control/imm_layout.hpp)",
          request.ranks, control::imm::kMaxStreams);
  // The optional descriptors' positions, in the frame's order.
  size_t next = AttachRequest::count;
  const auto position = [&next](bool present) { return present ? next++ : kNoFd; };
  const size_t landing_fd = position(with_landing);
  const size_t device_ring_fd = position(request.device_ring);
  const size_t step_ring_fd = position(request.step_ring);
  const size_t device_staging_fd = position(with_fd(request.device_staging));
  const size_t device_arena_fd = position(with_fd(request.device_arena));

  State& s = *state_;
  s.arena = map_client_fd(fds[AttachRequest::arena], "arena");
  s.staging = map_client_fd(fds[AttachRequest::staging], "staging area");
  s.ring_memory = map_client_fd(fds[AttachRequest::ring], "descriptor ring");
  s.relay_memory = map_client_fd(fds[AttachRequest::relay], "signal relay ring");
  s.doorbell = std::make_unique<gpu_side::Doorbell>(
      gpu_side::Doorbell::adopt(std::exchange(fds[AttachRequest::doorbell], -1)));
  const gpu_side::Ring ring = gpu_side::Ring::attach(s.ring_memory->bytes());
  s.relay = std::make_unique<proxy::RelaySender>(gpu_side::Ring::attach(s.relay_memory->bytes()));
  s.router.relay_to(*s.relay);

  s.fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(request.rank));
  s.arena_region = s.fabric->register_memory(s.arena->host(), s.arena->size());
  s.staging_region = s.fabric->register_memory(s.staging->host(), s.staging->size());
  if (with_landing &&
      proxy::registers_landing(request.landing_fabric, s.fabric->capabilities().provider)) {
    s.landing = map_client_fd(fds[landing_fd], "landing region");
    s.landing_region = s.fabric->register_memory(s.landing->host(), s.landing->size());
  }
  proxy::EngineOptions options = proxy::EngineOptions::from_params();
  options.tolerate_peer_failures = request.tolerate_peer_failures;
  s.engine = std::make_unique<proxy::ProxyEngine>(*s.fabric, request.rank, request.ranks, s.router,
                                                  options);
  s.engine->regions().add_local(proxy::FabricLink::kArenaRegion, *s.arena_region);
  s.engine->regions().add_local(proxy::FabricLink::kStagingRegion, *s.staging_region);
  s.engine->add_ring(ring, s.doorbell.get());
  if (request.device_ring) {
    // No doorbell: the client's route keeps the thread polling.
    s.device_ring_memory = map_client_fd(fds[device_ring_fd], "device ring");
    s.engine->add_ring(gpu_side::Ring::attach(s.device_ring_memory->bytes()), nullptr);
  }
  if (request.step_ring) {
    // No doorbell either: a graph rings none, and the proxy threads keep polling once the
    // steps are linked (link_steps).
    s.step_ring_memory = map_client_fd(fds[step_ring_fd], "step ring");
    s.engine->add_ring(gpu_side::Ring::attach(s.step_ring_memory->bytes()), nullptr);
  }
  if (request.device_staging &&
      register_device_memory(*request.device_staging, fd_at(fds, device_staging_fd),
                             "device staging", s.device_staging, s.device_staging_region))
    s.engine->regions().add_local(proxy::FabricLink::kDeviceStagingRegion,
                                  *s.device_staging_region);
  if (request.device_arena)
    register_device_memory(*request.device_arena, fd_at(fds, device_arena_fd), "device arena",
                           s.device_arena, s.device_arena_region);
  peer_failure_reported_.assign(static_cast<size_t>(request.ranks), false);
}

std::string ServedRank::open_device_memory(const std::string& kind,
                                           const AttachRequest::DeviceMemory& offer, int fd,
                                           gpu_side::device::NicMemory& memory,
                                           std::unique_ptr<fabric::MemoryRegion>& region) {
  // Chosen from the capabilities alone, as in process (proxy/in_process_session.cpp): without
  // FI_HMEM, or where this memory does not open or register, the client's host memory serves.
  State& s = *state_;
  const fabric::Capabilities& caps = s.fabric->capabilities();
  if (!caps.hmem)
    return fmt::format("provider {} does not register device memory (no FI_HMEM)", caps.provider);
  try {
    gpu_side::device::NicMemory opened =
        open_client_device_memory(kind, offer.handle, fd, offer.bytes, kPhase);
    // The proxy threads held out of their passes once they run (the steps' memory comes later).
    s.engine->amend(
        [&] {
          region = s.fabric->register_memory(
              opened.memory.get(), opened.bytes,
              opened.registers_as_host ? fabric::MemoryKind::host : fabric::MemoryKind::cuda);
        },
        Deadline(kAmendTimeout));
    memory = std::move(opened);
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

bool ServedRank::register_device_memory(const AttachRequest::DeviceMemory& offer, int fd,
                                        std::string_view what, gpu_side::device::NicMemory& memory,
                                        std::unique_ptr<fabric::MemoryRegion>& region) {
  const std::string why = open_device_memory(request_.device_kind, offer, fd, memory, region);
  if (why.empty()) return true;
  if (!device_memory_note_.empty()) device_memory_note_ += "; ";
  device_memory_note_ += fmt::format("{} not registered: {}", what, why);
  log::info("proxyepd: rank {}: the client's {} is not registered ({}); its host memory serves",
            request_.rank, what, why);
  return false;
}

std::optional<fabric::Bytes> ServedRank::add_step_memory(
    uint64_t bytes, const std::optional<AttachRequest::DeviceMemory>& device,
    const std::string& device_kind, int fd, std::string& note) {
  State& s = *state_;
  require(started_ && !steps_linked(), kStepPhase,
          "step memory comes after start and before the steps are linked");
  require(bytes > 0, kStepPhase, "step memory of no bytes");
  const Deadline deadline(kAmendTimeout);
  // The previous offer, never linked, goes first (nothing in the region table names it).
  if (s.step_region) s.engine->amend([&] { s.step_region.reset(); }, deadline);
  s.step_memory.reset();
  s.step_device_memory = {};
  if (device) {
    // As the attach's device memory.
    note = open_device_memory(device_kind, *device, fd, s.step_device_memory, s.step_region);
    if (!note.empty()) return std::nullopt;
  } else {
    s.step_memory = map_client_fd(fd, "step memory");
    require(s.step_memory->size() >= bytes, kStepPhase,
            "the step memory's memfd has {} bytes, {} announced", s.step_memory->size(), bytes);
    s.engine->amend(
        [&] { s.step_region = s.fabric->register_memory(s.step_memory->host(), bytes); }, deadline);
  }
  return s.step_region->descriptor().serialize();
}

void ServedRank::link_steps(const std::vector<fabric::Bytes>& descriptors, int words_fd,
                            uint32_t words, bool keep_polling) {
  State& s = *state_;
  require(s.step_region != nullptr && !steps_linked(), kStepPhase,
          "the steps are linked once, after their memory was registered");
  require(descriptors.size() == static_cast<size_t>(request_.ranks), kStepPhase,
          "{} step region descriptors for a job of {} ranks", descriptors.size(), request_.ranks);
  auto counted = std::make_unique<control::SignalWords>(
      words, std::move(*map_client_fd(words_fd, "signal words")));
  s.engine->amend(
      [&] {
        s.engine->regions().add_local(proxy::StepTransport::kRegion, *s.step_region);
        for (int r = 0; r < request_.ranks; ++r)
          s.engine->regions().add_remote(
              r, proxy::StepTransport::kRegion,
              fabric::RegionDescriptor::deserialize(descriptors[static_cast<size_t>(r)]));
        s.router.attach_words(*counted);
      },
      Deadline(kAmendTimeout));
  s.step_words = std::move(counted);
  if (keep_polling) s.engine->keep_polling(true);
}

ServedRank::~ServedRank() {
  if (!state_->engine) return;
  state_->engine->stop();
  if (state_->engine->abandoned()) {
    log::warn(
        "proxyepd: a proxy thread of rank {} is stuck inside the fabric provider; its fabric and "
        "memory are kept for the life of the daemon",
        request_.rank);
    (void)keep_forever(std::move(state_));
    fabric::remove_own_shm_regions_at_exit();  // the abandoned shm endpoints' regions
  }
}

fabric::Bytes ServedRank::arena_descriptor() const {
  return state_->arena_region->descriptor().serialize();
}

std::optional<fabric::Bytes> ServedRank::device_arena_descriptor() const {
  if (!state_->device_arena_region) return std::nullopt;
  return state_->device_arena_region->descriptor().serialize();
}

std::optional<fabric::Bytes> ServedRank::landing_descriptor() const {
  if (!state_->landing_region) return std::nullopt;
  return state_->landing_region->descriptor().serialize();
}

void ServedRank::connect(const std::vector<fabric::Bytes>& group) {
  require(group_.empty(), kPhase, "rank {} asked to connect twice", request_.rank);
  require(group.size() == static_cast<size_t>(request_.ranks), kPhase,
          "{} fabric addresses for a job of {} ranks", group.size(), request_.ranks);
  require(group[static_cast<size_t>(request_.rank)] == addresses(), kPhase,
          "the address list names another endpoint as rank {} (this client's own)", request_.rank);
  state_->fabric->connect(group);
  group_ = group;
}

void ServedRank::add_arenas(const std::vector<fabric::Bytes>& descriptors,
                            const std::vector<fabric::Bytes>& landing_descriptors,
                            const std::vector<fabric::Bytes>& device_arena_descriptors) {
  require(!group_.empty() && !started_, kPhase,
          "arena descriptors come after connect, before start");
  require(descriptors.size() == static_cast<size_t>(request_.ranks), kPhase,
          "{} arena descriptors for a job of {} ranks", descriptors.size(), request_.ranks);
  const bool landing = state_->landing_region != nullptr;
  require(landing_descriptors.size() == (landing ? descriptors.size() : 0u), kPhase,
          "{} landing descriptors for a job of {} ranks (this rank's landing region is {})",
          landing_descriptors.size(), request_.ranks, landing ? "registered" : "not registered");
  require(device_arena_descriptors.empty() || device_arena_descriptors.size() == descriptors.size(),
          kPhase, "{} device arena descriptors for a job of {} ranks",
          device_arena_descriptors.size(), request_.ranks);
  // Every descriptor is checked before anything is registered, so a refused list leaves the
  // region table as it was (and the client's connection ends with the reason).
  const auto arenas = checked_descriptors(Descriptors::arena, descriptors, arena_descriptor());
  const auto landings =
      landing ? checked_descriptors(Descriptors::landing, landing_descriptors, landing_descriptor())
              : std::vector<std::optional<fabric::RegionDescriptor>>{};
  const auto device_arenas =
      device_arena_descriptors.empty()
          ? std::vector<std::optional<fabric::RegionDescriptor>>{}
          : checked_descriptors(Descriptors::device_arena, device_arena_descriptors,
                                device_arena_descriptor());
  if (landing)
    state_->engine->regions().add_local(proxy::FabricLink::kLandingRegion, *state_->landing_region);
  for (int r = 0; r < request_.ranks; ++r) {
    const auto i = static_cast<size_t>(r);
    state_->engine->regions().add_remote(r, proxy::FabricLink::kArenaRegion, *arenas[i]);
    if (landing)
      state_->engine->regions().add_remote(r, proxy::FabricLink::kLandingRegion, *landings[i]);
    // Empty: rank r registered no device arena; its client sends it none.
    if (!device_arenas.empty() && device_arenas[i])
      state_->engine->regions().add_remote(r, proxy::FabricLink::kDeviceArenaRegion,
                                           *device_arenas[i]);
  }
}

std::vector<std::optional<fabric::RegionDescriptor>> ServedRank::checked_descriptors(
    Descriptors which, const std::vector<fabric::Bytes>& serialized,
    const std::optional<fabric::Bytes>& own) const {
  const std::string_view kind = which == Descriptors::arena     ? "arena"
                                : which == Descriptors::landing ? "landing"
                                                                : "device arena";
  const auto own_rank = static_cast<size_t>(request_.rank);
  // This client's own entry must be the region this daemon registered for it, byte for byte:
  // a client cannot point its own rank's writes at memory it was not given.
  require(own.has_value() ? serialized[own_rank] == *own : serialized[own_rank].empty(), kPhase,
          "rank {}'s {} descriptor is not the one this daemon gave it", request_.rank, kind);
  std::optional<fabric::RegionDescriptor> mine;
  if (own) mine = fabric::RegionDescriptor::deserialize(*own);
  std::vector<std::optional<fabric::RegionDescriptor>> out(serialized.size());
  for (size_t r = 0; r < serialized.size(); ++r) {
    if (serialized[r].empty()) {
      // Only a device arena may be missing (a rank that registered none).
      require(which == Descriptors::device_arena, kPhase, "rank {}'s {} descriptor is empty", r,
              kind);
      continue;
    }
    try {
      out[r] = fabric::RegionDescriptor::deserialize(serialized[r]);
    } catch (const std::exception& e) {
      fail(kPhase, "rank {}'s {} descriptor is malformed: {}", r, kind, e.what());
    }
    require(!out[r]->rails.empty() && out[r]->length > 0, kPhase,
            "rank {}'s {} descriptor names no memory ({} bytes on {} rails)", r, kind,
            out[r]->length, out[r]->rails.size());
    // Every rank's arena has the one layout the job agreed on (proxy/arena_layout.hpp), so a
    // longer one is a lie about the peer's memory, and a shorter one a broken launch.
    if (which == Descriptors::arena && mine)
      require(out[r]->length == mine->length, kPhase,
              "rank {}'s {} descriptor is {} bytes long; every rank's is {} (this one's)", r, kind,
              out[r]->length, mine->length);
  }
  return out;
}

void ServedRank::open_connections(const std::vector<int>& peers) {
  require(!group_.empty() && !started_, kPhase, "connections open after connect, before start");
  for (int peer : peers)
    require(peer >= 0 && peer < request_.ranks && peer != request_.rank, kPhase,
            "rank {} asked for a connection to rank {} (a job of {} ranks)", request_.rank, peer,
            request_.ranks);
  state_->fabric->open_connections(
      proxy::connection_probes(state_->engine->regions(), peers, kPhase));
}

bool ServedRank::connections_open() {
  require(!started_, kPhase, "connections open before start");
  return state_->fabric->connections_open();
}

std::vector<int> ServedRank::peers_awaiting_connection() const {
  return state_->fabric->peers_awaiting_connection();
}

void ServedRank::start() {
  require(!group_.empty() && !started_, kPhase, "start comes once, after connect");
  state_->engine->start();
  started_ = true;
}

void ServedRank::progress() {
  if (!started_) state_->fabric->progress();
}

std::optional<proxy::Failure> ServedRank::failure() const {
  return state_->engine->health().failure();
}

std::vector<std::pair<int, proxy::Failure>> ServedRank::new_peer_failures() {
  std::vector<std::pair<int, proxy::Failure>> found;
  if (!request_.tolerate_peer_failures) return found;
  for (int r = 0; r < request_.ranks; ++r) {
    if (peer_failure_reported_[static_cast<size_t>(r)]) continue;
    if (auto failure = state_->engine->health().peer_failure(r)) {
      peer_failure_reported_[static_cast<size_t>(r)] = true;
      found.emplace_back(r, *failure);
    }
  }
  return found;
}

std::vector<proxy::ThreadStats> ServedRank::thread_stats() const {
  return state_->engine->all_thread_stats();
}

}  // namespace proxyep::daemon
