// The proxy host in the node daemon (proxy_host_daemon.hpp).
#include "proxy/session/proxy_host_daemon.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/step_clock.hpp"
#include "control/daemon_frames.hpp"
#include "control/job_credentials.hpp"
#include "proxy/engine/fabric_connections.hpp"
#include "proxy/session/session.hpp"
#include "proxy/session/session_waits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";
// The socket is read every this many polls of a wait (a recv() that finds nothing costs ~1 us).
constexpr uint32_t kPollsPerSocketRead = 64;

std::vector<std::string> hex_all(const std::vector<fabric::Bytes>& blobs) {
  std::vector<std::string> out;
  for (const auto& blob : blobs)
    out.push_back(control::hex_encode(blob));
  return out;
}

fabric::Bytes hex_field(const nlohmann::json& reply, const char* key) {
  const auto value = reply.find(key);
  require(value != reply.end() && value->is_string(), kPhase, "proxyepd's '{}' answer lacks '{}'",
          control::message_type(reply), key);
  return control::hex_decode(value->get<std::string>(), key, kPhase);
}

std::optional<fabric::Bytes> optional_hex_field(const nlohmann::json& reply, const char* key) {
  if (!reply.contains(key)) return std::nullopt;
  return hex_field(reply, key);
}

// The daemon's answer to step_memory: the registered region's descriptor, or (device memory
// only) why it declined.
struct Registered {
  fabric::Bytes descriptor;
  std::string note;
};

Registered read_registered(const nlohmann::json& reply, std::string_view phase) {
  Registered out;
  if (const auto region = reply.find("region"); region != reply.end() && region->is_string())
    out.descriptor = control::hex_decode(region->get<std::string>(), "region", phase);
  out.note = reply.value("note", std::string());
  require(!out.descriptor.empty() || !out.note.empty(), std::string(phase),
          "proxyepd's 'step_memory_registered' answer has neither 'region' nor 'note'");
  return out;
}

}  // namespace

HostOpened DaemonHost::open(const HostAttach& attach) {
  const SessionConfig& config = attach.config;
  const Deadline deadline(timeout_);
  producer_ = &attach.producer;
  daemon_ = control::DaemonConnection::open(config.daemon_socket, control::ClientKind::attach,
                                            timeout_, kPhase);
  relay_memory_ =
      std::make_unique<HostMemory>(host_memory(gpu_side::Ring::bytes_for(kRelaySlots), "relay"));
  // One producer: the daemon (under its lock); a push that times out then owes nothing.
  relay_ = std::make_unique<RelayReceiver>(
      gpu_side::Ring::create(relay_memory_->bytes(), kRelaySlots, gpu_side::ProducerMode::single),
      attach.router);
  std::vector<int> fds{attach.node.local_fd(), attach.staging.fd(), attach.ring_memory.fd(),
                       attach.doorbell.fd(), relay_memory_->fd()};
  const int ranks = attach.layout.sizes().ranks;
  nlohmann::json request{{"proxyep", "attach"},
                         {"rank", rank_},
                         {"ranks", ranks},
                         {"tolerate_peer_failures", config.tolerate_peer_failures}};
  // The job's mark on this rank's place at the daemon: only clients that hold the job's secret
  // may name this rank's endpoint (control/job_credentials.hpp). The same credentials the
  // bootstrap proved itself with.
  if (const auto tag = control::daemon_job_tag(control::JobCredentials::from_environment());
      !tag.empty())
    request["job_tag"] = tag;
  // The landing region is a memfd the node's ranks map already: the daemon maps it too and
  // registers it (when ep.landing_fabric says so for its fabric), so rows from other nodes land
  // in recv_x as in process.
  if (config.landing_fd >= 0 && !config.landing.empty()) {
    fds.push_back(config.landing_fd);
    request["landing_fabric"] = config.landing_fabric;
  }
  if (attach.route_ring) {
    fds.push_back(attach.route_ring->memory().fd());
    request["device_ring"] = true;
  }
  if (attach.steps) {
    // Drained from the start; what else the steps need comes at the first captured call.
    fds.push_back(attach.steps->ring_memory().fd());
    request["step_ring"] = true;
  }
  if (config.device) offer_device_memory(attach, request, fds);
  const nlohmann::json answer = daemon_->request(request, fds, "opened", deadline, kPhase);
  mark_step(config.setup_clock, "attached");
  provider_ = answer.value("provider", std::string("?"));
  HostOpened opened{.addresses = hex_field(answer, "addresses"),
                    .arena = hex_field(answer, "arena"),
                    .landing = optional_hex_field(answer, "landing"),
                    .device_arena = optional_hex_field(answer, "device_arena")};
  if (device_staging_.memory && answer.value("device_staging", false))
    opened.device_staging = device_staging_.memory.get();
  else
    device_staging_ = {};
  if (const std::string note = answer.value("device_memory_note", std::string()); !note.empty())
    log::info("buffer: rank {}: proxyepd: {}", rank_, note);
  peer_failures_.assign(static_cast<size_t>(ranks), std::nullopt);
  return opened;
}

void DaemonHost::offer_device_memory(const HostAttach& attach, nlohmann::json& request,
                                     std::vector<int>& fds) {
  gpu_side::device::DeviceRuntime& device = *attach.config.device;
  // The memory of each: its handle, and its descriptor where the device has one.
  const auto entry = [&fds](std::span<const uint8_t> handle, uint64_t bytes, int fd) {
    if (fd >= 0) fds.push_back(fd);
    return nlohmann::json{
        {"handle", control::hex_encode(handle)}, {"bytes", bytes}, {"fd", fd >= 0}};
  };
  nlohmann::json offer{{"kind", std::string(device.kind())}};
  // Device staging as in process: the staging data area's size, where the device offers memory
  // a NIC reads; the daemon registers it only with FI_HMEM.
  if (const uint64_t bytes = attach.layout.sizes().staging_bytes; bytes > 0) {
    gpu_side::device::SharedMemory shared = device.allocate_shared(bytes);
    if (shared.memory && shared.nic_reads) {
      offer["staging"] = entry(shared.handle, bytes, shared.fd);
      device_staging_ = std::move(shared);
    }
  }
  const DeviceArenas& arenas = attach.device_arenas;
  if (arenas.local() != nullptr && arenas.nic_reads())
    offer["arena"] = entry(arenas.local_handle(), arenas.bytes(), arenas.local_fd());
  if (offer.contains("staging") || offer.contains("arena")) request["device_memory"] = offer;
}

void DaemonHost::connect(const std::vector<fabric::Bytes>& addresses) {
  daemon_->request({{"proxyep", "connect"}, {"addresses", hex_all(addresses)}}, {}, "connected",
                   Deadline(timeout_), kPhase);
}

void DaemonHost::add_regions(const std::vector<fabric::Bytes>& arenas,
                             const std::vector<fabric::Bytes>& landings,
                             const std::vector<fabric::Bytes>& device_arenas) {
  nlohmann::json request{{"proxyep", "arenas"}, {"descriptors", hex_all(arenas)}};
  if (!landings.empty()) request["landing_descriptors"] = hex_all(landings);
  if (!device_arenas.empty()) request["device_arena_descriptors"] = hex_all(device_arenas);
  daemon_->request(request, {}, "arenas_added", Deadline(timeout_), kPhase);
}

void DaemonHost::open_connections(const std::vector<int>& peers, const Deadline& deadline) {
  daemon_->request({{"proxyep", "open_connections"}, {"peers", peers}}, {}, "connections_opening",
                   deadline, kPhase);
  nlohmann::json reply;
  wait_for_connections(
      [&] {
        reply = daemon_->request({{"proxyep", "connections"}}, {}, "connections", deadline, kPhase);
        return reply.value("open", false);
      },
      [&] { return "rank(s) " + reply.value("waiting", nlohmann::json::array()).dump(); }, peers_,
      deadline, kPhase);
}

void DaemonHost::start() {
  daemon_->request({{"proxyep", "start"}}, {}, "started", Deadline(timeout_), kPhase);
  log::debug("buffer: rank {} attached to proxyepd at {} ({})", rank_, daemon_->path(), provider_);
}

void DaemonHost::stop() noexcept {
  if (!daemon_) return;
  // Detach politely; the daemon stops this rank's proxy threads before it answers, so nothing
  // of this process's memory is touched afterwards. A daemon that is gone needs nothing.
  try {
    if (!failure_) {
      const Deadline deadline(std::chrono::milliseconds(std::min<int64_t>(timeout_.count(), 5000)));
      daemon_->request({{"proxyep", "detach"}}, {}, "detached", deadline, kPhase);
    }
  } catch (const Error& e) {
    log::debug("buffer: detaching from proxyepd: {}", e.what());
  }
  daemon_.reset();
}

const std::optional<std::string>& DaemonHost::poll_daemon() const {
  if (failure_ || !daemon_) return failure_;
  failure_ = daemon_->poll_failure([this](const nlohmann::json& message) {
    if (control::message_type(message) != "peer_failure") return false;
    const int peer = message.value("rank", -1);
    if (peer >= 0 && peer < static_cast<int>(peer_failures_.size()))
      peer_failures_[static_cast<size_t>(peer)] =
          fmt::format("{}: {}", message.value("phase", std::string("proxy")),
                      message.value("message", std::string("?")));
    return true;
  });
  return failure_;
}

void DaemonHost::check_health(std::string_view phase) const {
  if (const auto& failure = poll_daemon())
    fail(std::string(phase), "the Buffer's proxy (proxyepd) failed: {}; create a new Buffer",
         *failure);
}

std::optional<std::string> DaemonHost::peer_failure(int rank) const {
  (void)poll_daemon();
  if (rank < static_cast<int>(peer_failures_.size()) && peer_failures_[static_cast<size_t>(rank)])
    return peer_failures_[static_cast<size_t>(rank)];
  return std::nullopt;
}

void DaemonHost::pump(std::string_view phase) {
  if (relay_ && relay_->drain() != Status::ok)
    fail(std::string(phase), "a signal relayed by proxyepd: {}", relay_->last_error());
  if (++polls_since_socket_ < kPollsPerSocketRead) return;
  polls_since_socket_ = 0;
  check_health(phase);
}

void DaemonHost::wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                            std::string_view phase, const std::function<std::string()>& describe) {
  // The daemon's proxy threads keep polling while this rank waits (ProducerState::waiting):
  // what it waits for arrives through their completion queues.
  struct Waiting {
    gpu_side::RingProducer* producer;
    explicit Waiting(gpu_side::RingProducer* p) : producer(p) {
      if (producer) producer->set_waiting(true);
    }
    ~Waiting() {
      if (producer) producer->set_waiting(false);
    }
  } waiting(producer_);
  poll_until(
      [&] {
        pump(phase);
        return ready();
      },
      deadline, phase, describe);
}

void DaemonHost::quiet(const FabricPoster& poster, const DeviceRouteRing* route_ring,
                       std::string_view phase) {
  const uint64_t target = poster.pushed();
  wait_until(
      [&] {
        return (target == 0 || poster.retired(target - 1)) &&
               (route_ring == nullptr || route_ring->retired_all());
      },
      Deadline(timeout_), phase,
      [&] {
        return fmt::format(
            "quiet: {} of this rank's writes had not completed within {} ms (proxyepd at {})",
            target, timeout_.count(), daemon_ ? daemon_->path() : "?");
      });
}

std::string DaemonHost::describe() const {
  return fmt::format("proxyepd at {} ({})", daemon_ ? daemon_->path() : "?", provider_);
}

HostMemory DaemonHost::host_memory(uint64_t bytes, std::string_view what) {
  std::string name = fmt::format("proxyep-{}-{}", what, rank_);
  for (char& c : name)
    if (c == ' ') c = '-';
  return HostMemory::memfd(bytes, name);
}

DeviceStepMemory DaemonHost::register_device_memory(gpu_side::device::DeviceRuntime& device,
                                                    uint64_t bytes, const Deadline& deadline,
                                                    std::string_view phase) {
  // Memory the daemon opens by its handle, as the device staging and arena of the attach.
  gpu_side::device::SharedMemory shared = device.allocate_shared(bytes);
  if (!shared.memory || !shared.nic_reads) return {};
  const nlohmann::json offer{
      {"kind", std::string(device.kind())},
      {"step",
       {{"handle", control::hex_encode(shared.handle)}, {"bytes", bytes}, {"fd", shared.fd >= 0}}}};
  std::vector<int> fds;
  if (shared.fd >= 0) fds.push_back(shared.fd);
  const Registered registered = read_registered(
      daemon_->request({{"proxyep", "step_memory"}, {"bytes", bytes}, {"device_memory", offer}},
                       fds, "step_memory_registered", deadline, phase),
      phase);
  if (registered.descriptor.empty()) {
    log::info(
        "buffer: rank {}: proxyepd: step memory not registered in device memory ({}); host "
        "memory serves",
        rank_, registered.note);
    return {};
  }
  return {.memory = shared.memory, .descriptor = registered.descriptor};
}

fabric::Bytes DaemonHost::register_host_memory(const HostMemory& memory, const Deadline& deadline,
                                               std::string_view phase) {
  const std::array<int, 1> fds{memory.fd()};
  const Registered registered =
      read_registered(daemon_->request({{"proxyep", "step_memory"}, {"bytes", memory.size()}}, fds,
                                       "step_memory_registered", deadline, phase),
                      phase);
  require(!registered.descriptor.empty(), std::string(phase),
          "proxyepd did not register the step memory: {}", registered.note);
  return registered.descriptor;
}

void DaemonHost::link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
                      bool keep_polling, const Deadline& deadline, std::string_view phase) {
  nlohmann::json request{{"proxyep", "step_link"},
                         {"words", words.size()},
                         {"keep_polling", keep_polling},
                         {"descriptors", hex_all(descriptors)}};
  const std::array<int, 1> fds{words.fd()};
  daemon_->request(request, fds, "step_linked", deadline, phase);
}

}  // namespace proxyep::proxy
