// The session (session.hpp): the check that every rank opens it with the same sizes, its
// collective setup through the proxy host, and the waits every protocol uses.
#include "proxy/session/session.hpp"

#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "common/wire.hpp"
#include "fabric/shm_stale.hpp"
#include "proxy/engine/fabric_connections.hpp"
#include "proxy/session/node_channel.hpp"
#include "proxy/session/proxy_host.hpp"
#include "proxy/session/proxy_host_daemon.hpp"
#include "proxy/session/proxy_host_in_process.hpp"
#include "proxy/session/session_waits.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";
constexpr uint64_t kRingSlots = 4096;

// The sizes as every rank sends them (little endian, common/wire.hpp):
//   u32 magic "PXSZ" | u16 version | u16 proxy mode (0 in process, 1 daemon) |
//   u64 ranks_per_node | u64 record_bytes | u64 eager_bytes | u64 eager_limit | u64 data_bytes |
//   u64 staging_bytes | u64 chunk_bytes | u32 internode (proxy::Internode)
constexpr uint32_t kSizesMagic = 0x5a535850;  // "PXSZ" read as little-endian bytes
constexpr uint16_t kSizesVersion = 4;

const char* internode_name(Internode internode) {
  return internode == Internode::hierarchical ? "hierarchical" : "per_rank";
}

struct Agreed {
  SessionSizes sizes;
  bool daemon = false;  // the proxy is the node daemon (SessionConfig::daemon_socket)
};

std::vector<uint8_t> encode(const Agreed& agreed) {
  const SessionSizes& s = agreed.sizes;
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(kSizesMagic);
  w.u16(kSizesVersion);
  w.u16(agreed.daemon ? 1 : 0);
  for (uint64_t v : {static_cast<uint64_t>(s.ranks_per_node), s.record_bytes, s.eager_bytes,
                     s.eager_limit, s.data_bytes, s.staging_bytes, s.chunk_bytes})
    w.u64(v);
  w.u32(static_cast<uint32_t>(s.internode));
  return out;
}

Agreed decode(std::span<const uint8_t> blob, int ranks, int from) {
  ByteReader r(blob, kPhase);
  require(r.u32("magic") == kSizesMagic && r.u16("version") == kSizesVersion, kPhase,
          "rank {} sent its Buffer options in another format (another ProxyEP version?)", from);
  Agreed agreed;
  agreed.daemon = r.u16("proxy mode") != 0;
  SessionSizes& s = agreed.sizes;
  s.ranks = ranks;
  s.ranks_per_node = static_cast<int>(r.u64("ranks_per_node"));
  s.record_bytes = r.u64("record_bytes");
  s.eager_bytes = r.u64("eager_bytes");
  s.eager_limit = r.u64("eager_limit");
  s.data_bytes = r.u64("data_bytes");
  s.staging_bytes = r.u64("staging_bytes");
  s.chunk_bytes = r.u64("chunk_bytes");
  const uint32_t internode = r.u32("internode");
  require(internode <= static_cast<uint32_t>(Internode::hierarchical), kPhase,
          "rank {} sent an unknown ep.internode ({})", from, internode);
  s.internode = static_cast<Internode>(internode);
  r.expect_end("Buffer options");
  return agreed;
}

// Every rank must open with the same sizes: they fix every offset (arena_layout.hpp).
void check_agreed(control::Bootstrap& bootstrap, const SessionSizes& mine, bool daemon) {
  auto all = bootstrap.allgather(encode({mine, daemon}), "buffer(options)");
  for (int r = 0; r < bootstrap.world_size(); ++r) {
    const Agreed agreed = decode(all[static_cast<size_t>(r)], mine.ranks, r);
    require(agreed.daemon == daemon, kPhase,
            "rank {} runs its proxy {}, rank {} {}: every rank must use the same proxy.mode", r,
            agreed.daemon ? "in proxyepd (proxy.mode daemon)" : "in process", bootstrap.rank(),
            daemon ? "in proxyepd" : "in process");
    const SessionSizes& theirs = agreed.sizes;
    require(theirs.internode == mine.internode, kPhase,
            "rank {} created its Buffer with ep.internode {}, rank {} with {}: every rank must "
            "use the same",
            r, internode_name(theirs.internode), bootstrap.rank(), internode_name(mine.internode));
    require(theirs == mine, kPhase,
            "rank {} created its Buffer with ranks_per_node {}, num_nvl_bytes {}, num_rdma_bytes "
            "{}, ep.chunk_bytes {}, ep.eager_bytes {} (record slots of {} bytes, eager slots of "
            "{}); rank {} with {}, {}, {}, {}, {} ({}, {}): every rank must pass the same",
            r, theirs.ranks_per_node, theirs.data_bytes, theirs.staging_bytes, theirs.chunk_bytes,
            theirs.eager_limit, theirs.record_bytes, theirs.eager_bytes, bootstrap.rank(),
            mine.ranks_per_node, mine.data_bytes, mine.staging_bytes, mine.chunk_bytes,
            mine.eager_limit, mine.record_bytes, mine.eager_bytes);
  }
}

}  // namespace

std::unique_ptr<Session> Session::open(control::Bootstrap& bootstrap, const SessionConfig& config) {
  SessionConfig agreed = config;
  agreed.sizes.ranks = bootstrap.world_size();
  const bool spans_nodes = agreed.sizes.spans_nodes();
  const bool daemon = !agreed.daemon_socket.empty() && spans_nodes;
  check_agreed(bootstrap, agreed.sizes, daemon);
  mark_step(config.setup_clock, "options agreed");
  std::unique_ptr<ProxyHost> host;
  if (daemon)
    host = std::make_unique<DaemonHost>(bootstrap.rank(), agreed.timeout, bootstrap.peer_watch());
  else if (spans_nodes)
    host =
        std::make_unique<InProcessHost>(bootstrap.rank(), agreed.timeout, bootstrap.peer_watch());
  return std::make_unique<Session>(bootstrap, agreed, std::move(host));
}

Session::Session(control::Bootstrap& bootstrap, const SessionConfig& config,
                 std::unique_ptr<ProxyHost> host)
    : layout_(bootstrap.rank(), config.sizes),
      timeout_(config.timeout),
      peers_(bootstrap.peer_watch()),
      state_(std::make_unique<State>()) {
  State& s = *state_;
  s.host = std::move(host);
  try {
    s.node =
        std::make_unique<NodeMemory>(bootstrap, layout_.arena_bytes(), ranks_per_node(), kPhase);
    mark_step(config.setup_clock, "node memory");
    s.device_arenas = std::make_unique<DeviceArenas>(
        bootstrap, config.device, layout_.arena_bytes(), ranks_per_node(), config.timeout, kPhase);
    if (config.device) mark_step(config.setup_clock, "device arenas");
    s.channels.resize(static_cast<size_t>(ranks()));
    for (int r = 0; r < ranks(); ++r)
      s.channels[r] = node_memory_channel(r, layout_, *s.node, *s.device_arenas);
    if (s.host) open_fabric(bootstrap, config);
    bootstrap.barrier("buffer(ready)");
    mark_step(config.setup_clock, "ready barrier");
  } catch (...) {
    bootstrap.set_progress({});  // it may point at the fabric about to go
    stop_and_settle();
    throw;
  }
}

Session::~Session() {
  stop_and_settle();
}

void Session::stop() noexcept {
  if (state_->host) state_->host->stop();
}

void Session::stop_and_settle() noexcept {
  // Before the channels go: the proxy threads route completions into their windows.
  stop();
  if (state_->host && state_->host->abandoned()) {
    log::warn(
        "buffer: a proxy thread is stuck inside the fabric provider; its fabric, memory "
        "and signal targets are kept for the life of the process");
    (void)keep_forever(std::move(state_));
    fabric::remove_own_shm_regions_at_exit();  // the abandoned shm endpoints' regions
  }
}

void Session::open_fabric(control::Bootstrap& bootstrap, const SessionConfig& config) {
  State& s = *state_;
  ProxyHost& host = *s.host;
  s.staging = std::make_unique<HostMemory>(host.host_memory(layout_.staging_bytes(), "staging"));
  s.ring_memory =
      std::make_unique<HostMemory>(host.host_memory(gpu_side::Ring::bytes_for(kRingSlots), "ring"));
  // One producer (this protocol thread), so a push that times out owes the ring nothing and the
  // ring positions FabricPoster counts stay exact.
  const auto ring =
      gpu_side::Ring::create(s.ring_memory->bytes(), kRingSlots, gpu_side::ProducerMode::single);
  s.doorbell = std::make_unique<gpu_side::Doorbell>();
  s.producer = std::make_unique<gpu_side::RingProducer>(
      ring, gpu_side::ProducerOptions{.doorbell = s.doorbell.get()});
  if (config.device) {
    s.route_ring = std::make_unique<DeviceRouteRing>(
        host.host_memory(gpu_side::Ring::bytes_for(DeviceRouteRing::kRingSlots), "device ring"));
    s.step =
        std::make_unique<StepTransport>(host.host_memory(StepTransport::ring_bytes(), "step ring"));
  }
  // Keys: records [0, R), eager bytes [R, 2R), releases [2R, 3R), landing-region writes
  // [3R, 4R) (fabric_channel.hpp).
  s.counters = std::make_unique<control::CounterBank>(4u * static_cast<uint32_t>(ranks()));
  s.router.attach_counters(*s.counters);
  const HostOpened opened = host.open({.layout = layout_,
                                       .config = config,
                                       .node = *s.node,
                                       .staging = *s.staging,
                                       .ring_memory = *s.ring_memory,
                                       .ring = ring,
                                       .doorbell = *s.doorbell,
                                       .producer = *s.producer,
                                       .route_ring = s.route_ring.get(),
                                       .steps = s.step.get(),
                                       .device_arenas = *s.device_arenas,
                                       .router = s.router});
  bootstrap.set_progress([&host] { host.progress(); });
  host.connect(bootstrap.allgather(opened.addresses, "buffer(fabric addresses)"));
  mark_step(config.setup_clock, "fabric addresses");
  const std::vector<bool> device_arena_of = share_regions(bootstrap, opened);
  mark_step(config.setup_clock, "regions shared");
  s.poster = std::make_unique<FabricPoster>(
      ring, *s.producer, static_cast<std::byte*>(s.staging->host()), *s.counters, timeout_,
      opened.from_caller, [this](std::string_view phase) { check_health(phase); });
  if (opened.device_staging != nullptr)
    s.poster->set_device_staging(*config.device, opened.device_staging,
                                 layout_.staging_data_base());
  for (int r = 0; r < ranks(); ++r) {
    if (!layout_.fabric_peer(r)) continue;
    auto channel = std::make_unique<FabricChannel>(r, layout_, s.node->local(), *s.poster,
                                                   opened.landing.has_value(),
                                                   s.device_arenas.get(), device_arena_of[r]);
    s.router.attach_stream(static_cast<uint32_t>(r), channel->window());
    s.router.attach_credits(static_cast<uint32_t>(r), channel->credits());
    s.channels[r] = std::move(channel);
  }
  mark_step(config.setup_clock, "channels");
  host.open_connections(layout_.peers_to_probe(), Deadline(timeout_));
  // Every rank's first write waits for every pair's connection. The Buffer's timeout, not the
  // bootstrap's: the connections of R ranks grow as R^2 on one box (~30 s at 256 ranks here).
  bootstrap.barrier("buffer(fabric ready)", timeout_);
  mark_step(config.setup_clock, "connections");
  bootstrap.set_progress({});  // the proxy threads own the rails from here on
  host.start();
  mark_step(config.setup_clock, "proxy started");
}

std::vector<bool> Session::share_regions(control::Bootstrap& bootstrap, const HostOpened& opened) {
  const auto region = [](uint32_t id) { return fmt::format("buffer(region {})", id); };
  const auto arenas = bootstrap.allgather(opened.arena, region(region::kArena));
  // Every rank decides alike whether its landing region is registered (ep.landing_fabric and
  // the provider are the job's).
  std::vector<fabric::Bytes> landings;
  if (opened.landing) landings = bootstrap.allgather(*opened.landing, region(region::kLanding));
  // Every rank, with a device arena registered or without (empty): collective.
  auto device_arenas = bootstrap.allgather(opened.device_arena.value_or(fabric::Bytes{}),
                                           region(region::kDeviceArena));
  std::vector<bool> device_arena_of(device_arenas.size());
  for (size_t r = 0; r < device_arenas.size(); ++r)
    device_arena_of[r] = !device_arenas[r].empty();
  if (std::find(device_arena_of.begin(), device_arena_of.end(), true) == device_arena_of.end())
    device_arenas.clear();
  state_->host->add_regions(arenas, landings, device_arenas);
  return device_arena_of;
}

bool Session::open_device_route(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                std::string_view phase) {
  State& s = *state_;
  if (!s.route_ring || !s.poster) return false;
  return s.route_ring->open(
      *s.poster, device, timeout_, [this](std::string_view p) { check_health(p); }, phase);
}

void Session::close_device_route() noexcept {
  if (state_->route_ring && state_->poster) state_->route_ring->close(*state_->poster);
}

DeviceRouteScope::~DeviceRouteScope() {
  if (!on_) return;
  try {
    session_.flush_device_route();
  } catch (const std::exception& e) {
    log::warn("session: handing writes to the device's stream: {}", e.what());
  }
  session_.close_device_route();
}

void Session::flush_device_route() {
  if (state_->route_ring) state_->route_ring->flush();
}

void Session::drive_device_route(std::string_view phase) {
  if (state_->route_ring) state_->route_ring->drive(*state_->poster, phase);
}

uint64_t Session::writes_from_device() const {
  return state_->route_ring ? state_->route_ring->posted() : 0;
}

uint64_t Session::sends_to_device_arenas() const {
  return state_->device_arenas->sends();
}

uint64_t Session::chunks_from_device_memory() const {
  return state_->poster ? state_->poster->device_chunks() : 0;
}

StepLink Session::open_step_link(control::Bootstrap& bootstrap,
                                 const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                 uint64_t bytes, uint32_t words, std::string_view phase) {
  State& s = *state_;
  require(s.step != nullptr && s.host != nullptr, std::string(phase),
          "steps between nodes need a group that spans nodes and a Buffer made with its device");
  check_health(phase);  // the daemon's notices read before a request's answer
  return s.step->open(bootstrap, *s.host, device, bytes, words, timeout_, phase);
}

void Session::begin_call(uint64_t call, const gpu_side::device::DeviceRuntime* rows_device) {
  state_->device_arenas->begin_call(call, rows_device);
  if (state_->counters && call > 0 && state_->counters->begin_epoch(call) != Status::ok)
    fail(kPhase, "call {}: writes of an earlier call were left over: {}", call,
         state_->counters->last_leak());
}

void Session::check_health(std::string_view phase) const {
  if (state_->host) state_->host->check_health(phase);
}

bool Session::proxy_failed() const {
  return state_->host && state_->host->failed();
}

std::vector<ThreadStats> Session::proxy_thread_stats() const {
  return state_->host ? state_->host->thread_stats() : std::vector<ThreadStats>{};
}

std::optional<fabric::ReorderStats> Session::reorder_stats() const {
  return state_->host ? state_->host->reorder_stats() : std::nullopt;
}

std::optional<std::string> Session::peer_lost(int rank) const {
  if (rank == this->rank()) return std::nullopt;
  if (peers_ != nullptr && peers_->departed(rank)) return fmt::format("rank {} left the job", rank);
  if (auto gone = channel(rank).departed()) return gone;
  if (state_->host) return state_->host->peer_failure(rank);
  return std::nullopt;
}

void Session::ignore_peer(int rank, bool ignored) {
  if (!state_->counters) return;  // node peers send no signals
  const auto R = static_cast<uint32_t>(ranks()), r = static_cast<uint32_t>(rank);
  for (uint32_t key : {r, R + r, 2 * R + r})  // record, eager bytes, release (fabric_channel.hpp)
    state_->counters->ignore_key(key, ignored);
}

void Session::wait_for(const std::function<bool()>& ready, const Deadline& deadline,
                       std::string_view phase, const std::function<std::string()>& describe) {
  if (state_->host) {
    state_->host->wait_until(ready, deadline, phase, describe);
    return;
  }
  // One node: nothing to sleep on; the peers' stores arrive in shared memory.
  poll_until(ready, deadline, phase, describe);
}

void Session::await(const Wait& wait) {
  drive_device_route(wait.phase);  // what the peers answer may need this rank's writes
  if (wait.on_lost) {
    // The host's own deadline is beyond the wait's: a tick ends its waits.
    const auto host_deadline = Deadline(timeout_ + std::chrono::seconds(10));
    const std::function<std::string()> unreached = [] { return std::string("(not reached)"); };
    await_tolerant(*this, wait, timeout_, [&](const std::function<bool()>& ready_or_tick) {
      wait_for(ready_or_tick, host_deadline, wait.phase, unreached);
    });
    return;
  }
  DepartureWatch watch(*this, wait, peers_);
  // Built only for messages: the polls allocate nothing.
  const std::function<std::string()> describe = [&] {
    return describe_missing(*this, wait, timeout_);
  };
  wait_for([&] { return wait.ready() || watch.departed(); }, Deadline(timeout_), wait.phase,
           describe);
  if (!watch.departure().empty())
    fail(std::string(wait.phase), "{} while this rank waited for {}", watch.departure(), wait.what);
}

void Session::quiet(std::string_view phase) {
  if (!state_->host) return;
  drive_device_route(phase);  // the device's writes count too, once its stream pushed them
  state_->host->quiet(*state_->poster, state_->route_ring.get(), phase);
}

std::span<std::byte> Session::data_area() const {
  return {state_->node->local() + layout_.data_base(), layout_.sizes().data_bytes};
}

std::span<std::byte> Session::staging_data_area() const {
  if (!state_->staging || layout_.sizes().data_bytes == 0) return {};  // no rows to stage
  return {static_cast<std::byte*>(state_->staging->host()) + layout_.staging_data_base(),
          layout_.sizes().staging_bytes};
}

std::vector<std::span<std::byte>> Session::row_memory() const {
  std::vector<std::span<std::byte>> regions = state_->node->all_mapped();
  if (state_->staging) regions.push_back(state_->staging->bytes());
  return regions;
}

std::string Session::describe() const {
  const ArenaLayout& l = layout_;
  std::string out = fmt::format("{} ranks, {} per node, arena {} bytes ({} per source)", ranks(),
                                ranks_per_node(), l.arena_bytes(), l.source_area());
  if (l.sizes().spans_nodes())
    out += fmt::format(
        ", staging {} bytes, chunks of {} bytes between nodes, window {} (staging {})",
        l.staging_bytes(), l.remote_slots().slot_bytes, l.remote_slots().window, l.stage_window());
  if (state_->host) out += "; proxy: " + state_->host->describe();
  return out;
}

}  // namespace proxyep::proxy
