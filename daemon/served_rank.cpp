// The daemon's data path for one client (served_rank.hpp).
#include "daemon/served_rank.hpp"

#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "proxy/fabric_channel.hpp"
#include "proxy/session.hpp"

#include <unistd.h>

namespace proxyep::daemon {

namespace {

constexpr const char* kPhase = "daemon.attach";

std::unique_ptr<HostMemory> map_client_fd(int fd, const char* what) {
  try {
    return std::make_unique<HostMemory>(HostMemory::map_fd(fd));
  } catch (const Error& e) {
    fail(kPhase, "cannot map the client's {}: {}", what, e.what());
  }
}

}  // namespace

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
  const size_t expected =
      AttachRequest::count + (with_landing ? 1u : 0u) + (request.device_ring ? 1u : 0u);
  require(fds.size() == expected, kPhase,
          "the attach frame carried {} file descriptors, {} expected (arena, staging, ring, "
          "doorbell, relay{}{})",
          fds.size(), expected, with_landing ? ", landing" : "",
          request.device_ring ? ", device ring" : "");
  require(request.ranks >= 2 && request.rank >= 0 && request.rank < request.ranks, kPhase,
          "rank {} of {} ranks: a rank between 0 and ranks - 1, at least 2 ranks", request.rank,
          request.ranks);
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
    s.landing = map_client_fd(fds[AttachRequest::landing], "landing region");
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
    // The last descriptor. No doorbell: the client's route keeps the thread polling.
    s.device_ring_memory = map_client_fd(fds.back(), "device ring");
    s.engine->add_ring(gpu_side::Ring::attach(s.device_ring_memory->bytes()), nullptr);
  }
  peer_failure_reported_.assign(static_cast<size_t>(request.ranks), false);
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
  }
}

fabric::Bytes ServedRank::arena_descriptor() const {
  return state_->arena_region->descriptor().serialize();
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
                            const std::vector<fabric::Bytes>& landing_descriptors) {
  require(!group_.empty() && !started_, kPhase,
          "arena descriptors come after connect, before start");
  require(descriptors.size() == static_cast<size_t>(request_.ranks), kPhase,
          "{} arena descriptors for a job of {} ranks", descriptors.size(), request_.ranks);
  const bool landing = state_->landing_region != nullptr;
  require(landing_descriptors.size() == (landing ? descriptors.size() : 0u), kPhase,
          "{} landing descriptors for a job of {} ranks (this rank's landing region is {})",
          landing_descriptors.size(), request_.ranks, landing ? "registered" : "not registered");
  if (landing)
    state_->engine->regions().add_local(proxy::FabricLink::kLandingRegion, *state_->landing_region);
  for (int r = 0; r < request_.ranks; ++r) {
    state_->engine->regions().add_remote(
        r, proxy::FabricLink::kArenaRegion,
        fabric::RegionDescriptor::deserialize(descriptors[static_cast<size_t>(r)]));
    if (landing)
      state_->engine->regions().add_remote(
          r, proxy::FabricLink::kLandingRegion,
          fabric::RegionDescriptor::deserialize(landing_descriptors[static_cast<size_t>(r)]));
  }
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
