// The daemon's data path for one client (served_rank.hpp).
#include "daemon/served_rank.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "control/imm_layout.hpp"
#include "daemon/client_device_memory.hpp"
#include "proxy/engine/rank_proxy.hpp"

#include <fmt/format.h>
#include <unistd.h>

namespace proxyep::daemon {

namespace {

constexpr const char* kPhase = "daemon.attach";

constexpr const char* kStepPhase = "daemon.steps";
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
  // The client's router (the rank's one) decodes its immediates: the daemon passes them on
  // undecoded (only the captured steps' words are counted here, link_steps).
  s.relay = std::make_unique<proxy::RelaySender>(gpu_side::Ring::attach(s.relay_memory->bytes()));

  proxy::EngineOptions engine = proxy::EngineOptions::from_params();
  engine.tolerate_peer_failures = request.tolerate_peer_failures;
  s.proxy = std::make_unique<proxy::RankProxy>(
      proxy::RankProxyOptions{.rank = request.rank,
                              .ranks = request.ranks,
                              .fabric = fabric::FabricOptions::from_params(request.rank),
                              .engine = engine,
                              .peers = nullptr,
                              .phase = kPhase},
      *s.relay);
  proxy::RankProxy& p = *s.proxy;
  p.register_rank_memory(s.arena->bytes(), s.staging->bytes());
  if (with_landing && proxy::registers_landing(request.landing_fabric, p.capabilities().provider)) {
    s.landing = map_client_fd(fds[landing_fd], "landing region");
    p.register_landing(s.landing->bytes(), request.landing_fabric);
  }
  p.add_ring(gpu_side::Ring::attach(s.ring_memory->bytes()), s.doorbell.get());
  if (request.device_ring) {
    // No doorbell: the client's route keeps the thread polling.
    s.device_ring_memory = map_client_fd(fds[device_ring_fd], "device ring");
    p.add_ring(gpu_side::Ring::attach(s.device_ring_memory->bytes()), nullptr);
  }
  if (request.step_ring) {
    // No doorbell either: a graph rings none, and the proxy threads keep polling once the
    // steps are linked (link_steps).
    s.step_ring_memory = map_client_fd(fds[step_ring_fd], "step ring");
    p.add_ring(gpu_side::Ring::attach(s.step_ring_memory->bytes()), nullptr);
  }
  if (request.device_staging)
    register_device_memory(proxy::DeviceMemoryUse::staging, *request.device_staging,
                           fd_at(fds, device_staging_fd));
  if (request.device_arena)
    register_device_memory(proxy::DeviceMemoryUse::arena, *request.device_arena,
                           fd_at(fds, device_arena_fd));
  peer_failure_reported_.assign(static_cast<size_t>(request.ranks), false);
}

std::string ServedRank::open_device_memory(proxy::DeviceMemoryUse use, const std::string& kind,
                                           const AttachRequest::DeviceMemory& offer, int fd) {
  proxy::RankProxy& p = *state_->proxy;
  // Without FI_HMEM nothing is opened: the answer says why, and the client's host memory serves.
  if (!p.capabilities().hmem) return p.register_device_memory(use, {});
  gpu_side::device::NicMemory opened;
  try {
    opened = open_client_device_memory(kind, offer.handle, fd, offer.bytes, kPhase);
  } catch (const Error& e) {
    return e.what();
  }
  return p.register_device_memory(use, std::move(opened));
}

void ServedRank::register_device_memory(proxy::DeviceMemoryUse use,
                                        const AttachRequest::DeviceMemory& offer, int fd) {
  const std::string why = open_device_memory(use, request_.device_kind, offer, fd);
  if (why.empty()) return;
  const char* what = use == proxy::DeviceMemoryUse::staging ? "device staging" : "device arena";
  if (!device_memory_note_.empty()) device_memory_note_ += "; ";
  device_memory_note_ += fmt::format("{} not registered: {}", what, why);
  log::info("proxyepd: rank {}: the client's {} is not registered ({}); its host memory serves",
            request_.rank, what, why);
}

std::optional<fabric::Bytes> ServedRank::add_step_memory(
    uint64_t bytes, const std::optional<AttachRequest::DeviceMemory>& device,
    const std::string& device_kind, int fd, std::string& note) {
  State& s = *state_;
  require(started() && !steps_linked(), kStepPhase,
          "step memory comes after start and before the steps are linked");
  require(bytes > 0, kStepPhase, "step memory of no bytes");
  // The previous offer, never linked, goes (nothing in the region table names it).
  s.proxy->drop_step_memory();
  s.step_memory.reset();
  if (device) {
    // As the attach's device memory.
    note = open_device_memory(proxy::DeviceMemoryUse::steps, device_kind, *device, fd);
    if (!note.empty()) return std::nullopt;
  } else {
    s.step_memory = map_client_fd(fd, "step memory");
    require(s.step_memory->size() >= bytes, kStepPhase,
            "the step memory's memfd has {} bytes, {} announced", s.step_memory->size(), bytes);
    s.proxy->register_step_memory(s.step_memory->bytes().first(bytes));
  }
  return s.proxy->step_descriptor();
}

void ServedRank::link_steps(const std::vector<fabric::Bytes>& descriptors, int words_fd,
                            uint32_t words, bool keep_polling) {
  State& s = *state_;
  require(s.proxy->step_descriptor().has_value() && !steps_linked(), kStepPhase,
          "the steps are linked once, after their memory was registered");
  auto counted = std::make_unique<control::SignalWords>(
      words, std::move(*map_client_fd(words_fd, "signal words")));
  s.proxy->link_steps(descriptors, *counted, keep_polling);
  s.step_words = std::move(counted);
}

ServedRank::~ServedRank() {
  if (!state_->proxy) return;
  state_->proxy->stop();
  if (state_->proxy->abandoned()) {
    log::warn(
        "proxyepd: a proxy thread of rank {} is stuck inside the fabric provider; its fabric and "
        "memory are kept for the life of the daemon",
        request_.rank);
    (void)keep_forever(std::move(state_));
  }
}

void ServedRank::connect(const std::vector<fabric::Bytes>& group) {
  state_->proxy->connect(group);
  group_ = group;
}

std::optional<proxy::Failure> ServedRank::failure() const {
  return state_->proxy->engine().health().failure();
}

std::vector<std::pair<int, proxy::Failure>> ServedRank::new_peer_failures() {
  std::vector<std::pair<int, proxy::Failure>> found;
  if (!request_.tolerate_peer_failures) return found;
  for (int r = 0; r < request_.ranks; ++r) {
    if (peer_failure_reported_[static_cast<size_t>(r)]) continue;
    if (auto failure = state_->proxy->engine().health().peer_failure(r)) {
      peer_failure_reported_[static_cast<size_t>(r)] = true;
      found.emplace_back(r, *failure);
    }
  }
  return found;
}

std::vector<proxy::ThreadStats> ServedRank::thread_stats() const {
  return state_->proxy->engine().all_thread_stats();
}

}  // namespace proxyep::daemon
