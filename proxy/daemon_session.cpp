// The node daemon's client session (daemon_session.hpp).
#include "proxy/daemon_session.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/daemon_frames.hpp"
#include "control/imm_layout.hpp"
#include "control/job_credentials.hpp"
#include "proxy/daemon_steps.hpp"
#include "proxy/fabric_connections.hpp"
#include "proxy/node_channel.hpp"
#include "proxy/session_waits.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";
constexpr uint64_t kRingSlots = 4096;
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

}  // namespace

DaemonSession::DaemonSession(control::Bootstrap& bootstrap, const SessionConfig& config)
    : Session(ArenaLayout(bootstrap.rank(), config.sizes)),
      timeout_(config.timeout),
      peers_(bootstrap.peer_watch()) {
  node_ = std::make_unique<NodeMemory>(bootstrap, layout().arena_bytes(), ranks_per_node(), kPhase);
  device_arenas_ = std::make_unique<DeviceArenas>(bootstrap, config.device, layout().arena_bytes(),
                                                  ranks_per_node(), config.timeout, kPhase);
  channels_.resize(static_cast<size_t>(ranks()));
  for (int r = 0; r < ranks(); ++r)
    channels_[r] = node_memory_channel(r, layout(), *node_, *device_arenas_);
  attach(bootstrap, config);
  bootstrap.barrier("buffer(ready)");
}

DaemonSession::~DaemonSession() {
  stop();
}

void DaemonSession::attach(control::Bootstrap& bootstrap, const SessionConfig& config) {
  require(static_cast<uint32_t>(ranks()) <= control::imm::kMaxStreams, kPhase,
          "{} ranks exceed the {} chunk streams an immediate can name", ranks(),
          control::imm::kMaxStreams);
  const Deadline deadline(timeout_);
  bool link_device_staging = false;
  daemon_ = control::DaemonConnection::open(config.daemon_socket, control::ClientKind::attach,
                                            timeout_, kPhase);
  staging_ = std::make_unique<HostMemory>(
      HostMemory::memfd(layout().staging_bytes(), fmt::format("proxyep-staging-{}", rank())));
  ring_memory_ = std::make_unique<HostMemory>(HostMemory::memfd(
      gpu_side::Ring::bytes_for(kRingSlots), fmt::format("proxyep-ring-{}", rank())));
  relay_memory_ = std::make_unique<HostMemory>(HostMemory::memfd(
      gpu_side::Ring::bytes_for(kRelaySlots), fmt::format("proxyep-relay-{}", rank())));
  // One producer each: this protocol thread into the ring, the daemon (under its lock) into
  // the relay; a push that times out then owes nothing and ring positions stay exact.
  const auto ring =
      gpu_side::Ring::create(ring_memory_->bytes(), kRingSlots, gpu_side::ProducerMode::single);
  const auto relay_ring =
      gpu_side::Ring::create(relay_memory_->bytes(), kRelaySlots, gpu_side::ProducerMode::single);
  doorbell_ = std::make_unique<gpu_side::Doorbell>();
  std::vector<int> fds{node_->local_fd(), staging_->fd(), ring_memory_->fd(), doorbell_->fd(),
                       relay_memory_->fd()};
  nlohmann::json attach{{"proxyep", "attach"},
                        {"rank", rank()},
                        {"ranks", ranks()},
                        {"tolerate_peer_failures", config.tolerate_peer_failures}};
  // The job's mark on this rank's place at the daemon: only clients that hold the job's secret
  // may name this rank's endpoint (control/job_credentials.hpp). The same credentials the
  // bootstrap proved itself with.
  if (const auto tag = control::daemon_job_tag(control::JobCredentials::from_environment());
      !tag.empty())
    attach["job_tag"] = tag;
  // The landing region is a memfd the node's ranks map already: the daemon maps it too and
  // registers it (when ep.landing_fabric says so for its fabric), so rows from other nodes land
  // in recv_x as in process.
  if (config.landing_fd >= 0 && !config.landing.empty()) {
    fds.push_back(config.landing_fd);
    attach["landing_fabric"] = config.landing_fabric;
  }
  if (config.device) {
    device_routing_ = std::make_unique<DeviceRouting>(
        HostMemory::memfd(gpu_side::Ring::bytes_for(DeviceRouting::kRingSlots),
                          fmt::format("proxyep-device-ring-{}", rank())));
    fds.push_back(device_routing_->memory().fd());
    attach["device_ring"] = true;
    if (ranks_per_node() < ranks()) {
      // The ring captured steps push into (step_link.hpp), drained from the start; what else
      // they need comes at the first captured call (open_step_link).
      step_ = std::make_unique<StepTransport>(HostMemory::memfd(
          StepTransport::ring_bytes(), fmt::format("proxyep-step-ring-{}", rank())));
      fds.push_back(step_->ring_memory().fd());
      attach["step_ring"] = true;
    }
    offer_device_memory(*config.device, attach, fds);
  }
  const nlohmann::json opened = daemon_->request(attach, fds, "opened", deadline, kPhase);
  provider_ = opened.value("provider", std::string("?"));
  const bool landing = opened.contains("landing");
  if (device_staging_.memory && opened.value("device_staging", false))
    link_device_staging = true;
  else
    device_staging_ = {};
  if (const std::string note = opened.value("device_memory_note", std::string()); !note.empty())
    log::info("buffer: rank {}: proxyepd: {}", rank(), note);

  const auto addresses =
      bootstrap.allgather(hex_field(opened, "addresses"), "buffer(fabric addresses)");
  daemon_->request({{"proxyep", "connect"}, {"addresses", hex_all(addresses)}}, {}, "connected",
                   deadline, kPhase);
  const auto arenas = bootstrap.allgather(hex_field(opened, "arena"), "buffer(region 0)");
  nlohmann::json regions{{"proxyep", "arenas"}, {"descriptors", hex_all(arenas)}};
  if (landing)
    regions["landing_descriptors"] =
        hex_all(bootstrap.allgather(hex_field(opened, "landing"), "buffer(region 2)"));
  // Every rank, with a device arena its daemon registered or without (empty): collective.
  const auto device_arenas = bootstrap.allgather(
      opened.contains("device_arena") ? hex_field(opened, "device_arena") : fabric::Bytes{},
      "buffer(region 5)");
  std::vector<bool> device_arena_of(device_arenas.size());
  for (size_t r = 0; r < device_arenas.size(); ++r)
    device_arena_of[r] = !device_arenas[r].empty();
  if (std::find(device_arena_of.begin(), device_arena_of.end(), true) != device_arena_of.end())
    regions["device_arena_descriptors"] = hex_all(device_arenas);
  daemon_->request(regions, {}, "arenas_added", deadline, kPhase);

  // Keys as in process (fabric_channel.hpp): records, eager bytes, releases, landing writes.
  counters_ = std::make_unique<control::CounterBank>(4u * static_cast<uint32_t>(ranks()));
  router_.attach_counters(*counters_);
  relay_ = std::make_unique<RelayReceiver>(relay_ring, router_);
  producer_ = std::make_unique<gpu_side::RingProducer>(
      ring, gpu_side::ProducerOptions{.doorbell = doorbell_.get()});
  link_ = std::make_unique<FabricLink>(ring, *producer_, static_cast<std::byte*>(staging_->host()),
                                       *counters_, timeout_, /*from_caller=*/false,
                                       [this](std::string_view phase) { check_health(phase); });
  if (link_device_staging)
    link_->set_device_staging(*config.device, device_staging_.memory.get(),
                              layout().staging_data_base());
  for (int r = 0; r < ranks(); ++r) {
    if (!layout().fabric_peer(r)) continue;
    auto channel = std::make_unique<FabricChannel>(r, layout(), node_->local(), *link_, landing,
                                                   device_arenas_.get(),
                                                   device_arena_of[static_cast<size_t>(r)]);
    router_.attach_stream(static_cast<uint32_t>(r), channel->window());
    router_.attach_credits(static_cast<uint32_t>(r), channel->credits());
    channels_[r] = std::move(channel);
  }
  peer_failures_.assign(static_cast<size_t>(ranks()), std::nullopt);
  open_connections(deadline);
  bootstrap.barrier("buffer(fabric ready)", timeout_);  // as in process
  daemon_->request({{"proxyep", "start"}}, {}, "started", deadline, kPhase);
  log::debug("buffer: rank {} attached to proxyepd at {} ({})", rank(), config.daemon_socket,
             provider_);
}

// As in process (fabric_connections.hpp), with the daemon driving the probes: it answers each
// poll at once and serves its other ranks meanwhile.
void DaemonSession::open_connections(const Deadline& deadline) {
  const std::vector<int> peers = peers_to_probe(layout());
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

void DaemonSession::stop() noexcept {
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

void DaemonSession::offer_device_memory(gpu_side::device::DeviceRuntime& device,
                                        nlohmann::json& attach, std::vector<int>& fds) {
  // The memory of each: its handle, and its descriptor where the device has one.
  const auto entry = [&fds](std::span<const uint8_t> handle, uint64_t bytes, int fd) {
    if (fd >= 0) fds.push_back(fd);
    return nlohmann::json{
        {"handle", control::hex_encode(handle)}, {"bytes", bytes}, {"fd", fd >= 0}};
  };
  nlohmann::json offer{{"kind", std::string(device.kind())}};
  // Device staging as in process (in_process_session.cpp): the staging data area's size, where
  // the device offers memory a NIC reads; the daemon registers it only with FI_HMEM.
  if (const uint64_t bytes = layout().sizes().staging_bytes; bytes > 0) {
    gpu_side::device::SharedMemory shared = device.allocate_shared(bytes);
    if (shared.memory && shared.nic_reads) {
      offer["staging"] = entry(shared.handle, bytes, shared.fd);
      device_staging_ = std::move(shared);
    }
  }
  if (device_arenas_->local() != nullptr && device_arenas_->nic_reads())
    offer["arena"] =
        entry(device_arenas_->local_handle(), device_arenas_->bytes(), device_arenas_->local_fd());
  if (offer.contains("staging") || offer.contains("arena")) attach["device_memory"] = offer;
}

const std::optional<std::string>& DaemonSession::poll_daemon() const {
  if (failure_ || !daemon_) return failure_;
  failure_ = daemon_->poll_failure([this](const nlohmann::json& message) {
    if (control::message_type(message) != "peer_failure") return false;
    const int peer = message.value("rank", -1);
    if (peer >= 0 && peer < ranks())
      peer_failures_[static_cast<size_t>(peer)] =
          fmt::format("{}: {}", message.value("phase", std::string("proxy")),
                      message.value("message", std::string("?")));
    return true;
  });
  return failure_;
}

void DaemonSession::check_health(std::string_view phase) const {
  if (const auto& failure = poll_daemon())
    fail(std::string(phase), "the Buffer's proxy (proxyepd) failed: {}; create a new Buffer",
         *failure);
}

void DaemonSession::pump(std::string_view phase) {
  if (relay_ && relay_->drain() != Status::ok)
    fail(std::string(phase), "a signal relayed by proxyepd: {}", router_.last_error());
  if (++polls_since_socket_ < kPollsPerSocketRead) return;
  polls_since_socket_ = 0;
  check_health(phase);
}

void DaemonSession::poll_until_ready(const std::function<bool()>& ready, const Deadline& deadline,
                                     std::string_view phase,
                                     const std::function<std::string()>& describe) {
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
  } waiting(producer_.get());
  Poller poller;
  for (uint32_t polls = 0;; ++polls) {
    pump(phase);
    if (ready()) return;
    if (polls % kPollsPerClockRead == 0 && deadline.expired())
      fail(std::string(phase), "{}", describe());
    poller.pause();
  }
}

void DaemonSession::begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device) {
  device_arenas_->begin_call(call, rows_device);
  if (counters_ && call > 0 && counters_->begin_epoch(call) != Status::ok)
    fail(kPhase, "call {}: writes of an earlier call were left over: {}", call,
         counters_->last_leak());
}

bool DaemonSession::route_posts(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                std::string_view phase) {
  if (!device_routing_ || !link_) return false;
  return device_routing_->route_posts(
      *link_, device, timeout_, [this](std::string_view p) { check_health(p); }, phase);
}

StepLink DaemonSession::open_step_link(
    control::Bootstrap& bootstrap, const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
    uint64_t bytes, uint32_t words, std::string_view phase) {
  require(step_ != nullptr && daemon_, std::string(phase),
          "steps between nodes need a group that spans nodes and a Buffer made with its device");
  check_health(phase);  // reads the notices the daemon sent, before a request's answer
  DaemonSteps proxy(*daemon_, rank(), phase);
  return step_->open(bootstrap, proxy, device, bytes, words, timeout_, phase);
}

void DaemonSession::flush_posts() {
  if (device_routing_) device_routing_->flush();
}

void DaemonSession::drive_route(std::string_view phase) {
  if (device_routing_) device_routing_->drive(*link_, phase);
}

void DaemonSession::await(const Wait& wait) {
  drive_route(wait.phase);  // what the peers answer may need this rank's writes
  if (wait.on_lost) {
    await_tolerant(*this, wait, timeout_, [&](const std::function<bool()>& ready_or_tick) {
      poll_until_ready(ready_or_tick, Deadline(timeout_ + std::chrono::seconds(10)), wait.phase,
                       [] { return std::string("(not reached)"); });
    });
    return;
  }
  DepartureWatch watch(*this, wait, peers_);
  poll_until_ready([&] { return wait.ready() || watch.departed(); }, Deadline(timeout_), wait.phase,
                   [&] { return describe_missing(*this, wait, timeout_); });
  if (!watch.departure().empty())
    fail(std::string(wait.phase), "{} while this rank waited for {}", watch.departure(), wait.what);
}

void DaemonSession::quiet(std::string_view phase) {
  if (!link_) return;
  drive_route(phase);  // the device's writes count too, once its stream pushed them
  const uint64_t target = link_->pushed();
  poll_until_ready(
      [&] {
        return (target == 0 || link_->retired(target - 1)) &&
               (!device_routing_ || device_routing_->retired_all());
      },
      Deadline(timeout_), phase,
      [&] {
        return fmt::format(
            "quiet: {} of this rank's writes had not completed within {} ms "
            "(proxyepd at {})",
            target, timeout_.count(), daemon_ ? daemon_->path() : "?");
      });
}

std::optional<std::string> DaemonSession::peer_lost(int rank) const {
  if (rank == this->rank()) return std::nullopt;
  if (peers_ != nullptr && peers_->departed(rank)) return fmt::format("rank {} left the job", rank);
  if (auto gone = channel(rank).departed()) return gone;
  (void)poll_daemon();
  if (rank < static_cast<int>(peer_failures_.size()) && peer_failures_[static_cast<size_t>(rank)])
    return peer_failures_[static_cast<size_t>(rank)];
  return std::nullopt;
}

void DaemonSession::ignore_peer(int rank, bool ignored) {
  if (!counters_) return;
  const auto R = static_cast<uint32_t>(ranks()), r = static_cast<uint32_t>(rank);
  for (uint32_t key : {r, R + r, 2 * R + r})  // record, eager bytes, release (fabric_channel.hpp)
    counters_->ignore_key(key, ignored);
}

std::span<std::byte> DaemonSession::data_area() const {
  return {node_->local() + layout().data_base(), layout().sizes().data_bytes};
}

std::span<std::byte> DaemonSession::staging_data_area() const {
  if (!staging_ || layout().sizes().data_bytes == 0) return {};
  return {static_cast<std::byte*>(staging_->host()) + layout().staging_data_base(),
          layout().sizes().staging_bytes};
}

std::vector<std::span<std::byte>> DaemonSession::row_memory() const {
  std::vector<std::span<std::byte>> regions = node_->all_mapped();
  if (staging_) regions.push_back(staging_->bytes());
  return regions;
}

std::string DaemonSession::describe() const {
  return fmt::format("{} ranks, {} per node, arena {} bytes; proxy: proxyepd at {} ({})", ranks(),
                     ranks_per_node(), layout().arena_bytes(), daemon_ ? daemon_->path() : "?",
                     provider_);
}

}  // namespace proxyep::proxy
