// The in-process session: construction, and the waits every protocol uses (in_process_session.hpp).
#include "proxy/in_process_session.hpp"

#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "control/imm_layout.hpp"
#include "fabric/shm_stale.hpp"
#include "proxy/fabric_connections.hpp"
#include "proxy/node_channel.hpp"
#include "proxy/region_exchange.hpp"
#include "proxy/session_waits.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";
constexpr uint64_t kRingSlots = 4096;

}  // namespace

InProcessSession::InProcessSession(control::Bootstrap& bootstrap, const SessionConfig& config)
    : Session(ArenaLayout(bootstrap.rank(), config.sizes)),
      timeout_(config.timeout),
      peers_(bootstrap.peer_watch()) {
  try {
    state_->node =
        std::make_unique<NodeMemory>(bootstrap, layout().arena_bytes(), ranks_per_node(), kPhase);
    mark_step(config.setup_clock, "node memory");
    state_->device_arenas = std::make_unique<DeviceArenas>(
        bootstrap, config.device, layout().arena_bytes(), ranks_per_node(), config.timeout, kPhase);
    if (config.device) mark_step(config.setup_clock, "device arenas");
    state_->channels.resize(static_cast<size_t>(ranks()));
    for (int r = 0; r < ranks(); ++r)
      state_->channels[r] = node_memory_channel(r, layout(), *state_->node, *state_->device_arenas);
    if (layout().sizes().spans_nodes()) open_fabric(bootstrap, config);
    bootstrap.barrier("buffer(ready)");
    mark_step(config.setup_clock, "ready barrier");
  } catch (...) {
    bootstrap.set_progress({});  // it may point at the fabric about to go
    stop_and_settle();
    throw;
  }
}

InProcessSession::~InProcessSession() {
  stop_and_settle();
}

void InProcessSession::stop_and_settle() noexcept {
  // Before the channels go: the proxy threads route completions into their windows.
  stop();
  if (state_->engine && state_->engine->abandoned()) {
    log::warn(
        "buffer: a proxy thread is stuck inside the fabric provider; its fabric, memory "
        "and signal targets are kept for the life of the process");
    (void)keep_forever(std::move(state_));
    fabric::remove_own_shm_regions_at_exit();  // the abandoned shm endpoints' regions
  }
}

void InProcessSession::open_fabric(control::Bootstrap& bootstrap, const SessionConfig& config) {
  State& s = *state_;
  require(static_cast<uint32_t>(ranks()) <= control::imm::kMaxStreams, kPhase,
          "{} ranks exceed the {} chunk streams an immediate can name", ranks(),
          control::imm::kMaxStreams);
  fabric::FabricOptions fabric_options =
      config.fabric ? *config.fabric : fabric::FabricOptions::from_params(rank());
  fabric_options.rank = rank();
  s.fabric = fabric::Fabric::open(fabric_options);
  mark_step(config.setup_clock, "fabric open");
  bootstrap.set_progress([&s] { s.fabric->progress(); });
  s.fabric->connect(bootstrap.allgather(s.fabric->addresses(), "buffer(fabric addresses)"));
  mark_step(config.setup_clock, "fabric addresses");
  s.staging = std::make_unique<HostMemory>(HostMemory::heap(layout().staging_bytes()));
  s.arena_region = s.fabric->register_memory(s.node->local(), s.node->bytes());
  s.staging_region = s.fabric->register_memory(s.staging->host(), s.staging->size());
  const bool landing = !config.landing.empty() &&
                       registers_landing(config.landing_fabric, s.fabric->capabilities().provider);
  if (landing)
    s.landing_region = s.fabric->register_memory(config.landing.data(), config.landing.size());
  mark_step(config.setup_clock, "memory registered");
  // Keys: records [0, R), eager bytes [R, 2R), releases [2R, 3R), landing-region writes
  // [3R, 4R) (fabric_channel.hpp).
  s.counters = std::make_unique<control::CounterBank>(4u * static_cast<uint32_t>(ranks()));
  s.router.attach_counters(*s.counters);

  EngineOptions engine_options = config.engine ? *config.engine : EngineOptions::from_params();
  engine_options.tolerate_peer_failures = config.tolerate_peer_failures;
  s.engine = std::make_unique<ProxyEngine>(*s.fabric, rank(), ranks(), s.router, engine_options);
  s.engine->watch_peers(peers_);
  share_region(bootstrap, s.engine->regions(), FabricLink::kArenaRegion, *s.arena_region, kPhase);
  if (landing)
    share_region(bootstrap, s.engine->regions(), FabricLink::kLandingRegion, *s.landing_region,
                 kPhase);
  s.engine->regions().add_local(FabricLink::kStagingRegion, *s.staging_region);
  mark_step(config.setup_clock, "regions shared");
  // The proxy threads live in this process: an address of the caller's is theirs too.
  const bool from_caller = config.send_from_caller && !s.fabric->capabilities().mr_local;
  if (from_caller) s.engine->regions().add_local_address_space(FabricLink::kCallerMemory);
  s.ring_memory =
      std::make_unique<HostMemory>(HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots)));
  // One producer (this protocol thread), so a push that times out owes the ring nothing and the
  // ring positions FabricLink counts stay exact.
  auto ring =
      gpu_side::Ring::create(s.ring_memory->bytes(), kRingSlots, gpu_side::ProducerMode::single);
  s.doorbell = std::make_unique<gpu_side::Doorbell>();
  s.engine->add_ring(ring, s.doorbell.get());
  s.producer = std::make_unique<gpu_side::RingProducer>(
      ring, gpu_side::ProducerOptions{.doorbell = s.doorbell.get()});
  if (config.device) {
    // No doorbell: the route keeps the proxy thread polling while a device call posts.
    s.device_routing = std::make_unique<DeviceRouting>(
        HostMemory::heap(gpu_side::Ring::bytes_for(DeviceRouting::kRingSlots)));
    s.engine->add_ring(s.device_routing->ring(), nullptr);
    s.step = std::make_unique<StepTransport>(HostMemory::heap(StepTransport::ring_bytes()));
    s.engine->add_ring(s.step->ring(), nullptr);
  }
  s.link = std::make_unique<FabricLink>(
      ring, *s.producer, static_cast<std::byte*>(s.staging->host()), *s.counters, timeout_,
      from_caller, [this](std::string_view phase) { check_health(phase); });
  if (config.device) open_device_staging(config);
  const std::vector<bool> device_arena_of = open_device_landing(bootstrap);
  for (int r = 0; r < ranks(); ++r) {
    if (!layout().fabric_peer(r)) continue;
    auto channel = std::make_unique<FabricChannel>(r, layout(), s.node->local(), *s.link, landing,
                                                   s.device_arenas.get(), device_arena_of[r]);
    s.router.attach_stream(static_cast<uint32_t>(r), channel->window());
    s.router.attach_credits(static_cast<uint32_t>(r), channel->credits());
    s.channels[r] = std::move(channel);
  }
  mark_step(config.setup_clock, "channels");
  open_fabric_connections(*s.fabric, s.engine->regions(), peers_to_probe(layout()), peers_,
                          Deadline(timeout_), kPhase);
  // Every rank's first write waits for every pair's connection. The Buffer's timeout, not the
  // bootstrap's: the connections of R ranks grow as R^2 on one box (~30 s at 256 ranks here).
  bootstrap.barrier("buffer(fabric ready)", timeout_);
  mark_step(config.setup_clock, "connections");
  bootstrap.set_progress({});  // the proxy threads own the rails from here on
  s.engine->start();
  mark_step(config.setup_clock, "proxy started");
}

void InProcessSession::open_device_staging(const SessionConfig& config) {
  State& s = *state_;
  const uint64_t bytes = layout().sizes().staging_bytes;
  // Chosen from the capabilities alone: a provider that registers device memory (FI_HMEM; EFA
  // does) and a device whose memory a NIC reads. Otherwise the host staging area is the bounce
  // buffer.
  if (bytes == 0 || !s.fabric->capabilities().hmem) return;
  gpu_side::device::NicMemory nic = config.device->allocate_for_nic(bytes);
  if (!nic.memory) return;
  try {
    s.device_staging_region = s.fabric->register_memory(
        nic.memory.get(), nic.bytes,
        nic.registers_as_host ? fabric::MemoryKind::host : fabric::MemoryKind::cuda);
  } catch (const Error& e) {
    // A provider may announce FI_HMEM for one kind of device memory and refuse another (a
    // libfabric built without CUDA): the host staging area then serves, as without FI_HMEM.
    log::info(
        "buffer: rank {}: device staging not registered ({}); device calls' chunks bounce "
        "through host staging",
        rank(), e.what());
    return;
  }
  s.device_staging = nic.memory;
  s.engine->regions().add_local(FabricLink::kDeviceStagingRegion, *s.device_staging_region);
  s.link->set_device_staging(*config.device, nic.memory.get(), layout().staging_data_base());
  log::debug(
      "buffer: rank {}: device calls write their chunks from {} bytes of {} memory (FI_HMEM)",
      rank(), bytes, config.device->kind());
}

std::vector<bool> InProcessSession::open_device_landing(control::Bootstrap& bootstrap) {
  State& s = *state_;
  const DeviceArenas& arenas = *s.device_arenas;
  // As for device staging: from the capabilities alone, and a registration the provider refuses
  // leaves the host arena the target, as without FI_HMEM.
  if (s.fabric->capabilities().hmem && arenas.local() != nullptr && arenas.nic_reads()) {
    try {
      s.device_arena_region = s.fabric->register_memory(
          arenas.local(), arenas.bytes(),
          arenas.registers_as_host() ? fabric::MemoryKind::host : fabric::MemoryKind::cuda);
    } catch (const Error& e) {
      log::info(
          "buffer: rank {}: device arena not registered ({}); other nodes' device calls write "
          "into its host arena",
          rank(), e.what());
    }
  }
  return share_optional_region(bootstrap, s.engine->regions(), FabricLink::kDeviceArenaRegion,
                               s.device_arena_region.get(), kPhase);
}

void InProcessSession::stop() noexcept {
  if (!state_->engine) return;
  state_->engine->stop();
}

bool InProcessSession::route_posts(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                   std::string_view phase) {
  State& s = *state_;
  if (!s.device_routing) return false;
  return s.device_routing->route_posts(
      *s.link, device, timeout_, [this](std::string_view p) { check_health(p); }, phase);
}

StepLink InProcessSession::open_step_link(
    control::Bootstrap& bootstrap, const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
    uint64_t bytes, uint32_t words, std::string_view phase) {
  State& s = *state_;
  require(s.step != nullptr, std::string(phase),
          "steps between nodes need a group that spans nodes and a Buffer made with its device");
  if (!s.step_proxy)
    s.step_proxy = std::make_unique<InProcessSteps>(*s.fabric, *s.engine, s.router);
  return s.step->open(bootstrap, *s.step_proxy, device, bytes, words, timeout_, phase);
}

void InProcessSession::flush_posts() {
  if (state_->device_routing) state_->device_routing->flush();
}

void InProcessSession::drive_route(std::string_view phase) {
  if (state_->device_routing) state_->device_routing->drive(*state_->link, phase);
}

void InProcessSession::begin_call(uint64_t call,
                                  const gpu_side::device::DeviceRuntime* rows_device) {
  state_->device_arenas->begin_call(call, rows_device);
  if (state_->counters && call > 0 && state_->counters->begin_epoch(call) != Status::ok)
    fail(kPhase, "call {}: writes of an earlier call were left over: {}", call,
         state_->counters->last_leak());
}

std::vector<ThreadStats> InProcessSession::proxy_thread_stats() const {
  return state_->engine ? state_->engine->all_thread_stats() : std::vector<ThreadStats>{};
}

bool InProcessSession::proxy_failed() const {
  return state_->engine && state_->engine->health().failed();
}

void InProcessSession::check_health(std::string_view phase) const {
  if (!state_->engine || !state_->engine->health().failed()) return;
  auto failure = state_->engine->health().failure();
  fail(std::string(phase), "the Buffer's proxy failed earlier ({}: {}); create a new Buffer",
       failure ? failure->phase : "?", failure ? failure->message : "?");
}

std::optional<std::string> InProcessSession::peer_lost(int rank) const {
  if (rank == this->rank()) return std::nullopt;
  if (peers_ != nullptr && peers_->departed(rank)) return fmt::format("rank {} left the job", rank);
  if (auto gone = channel(rank).departed()) return gone;
  if (state_->engine)
    if (auto failure = state_->engine->health().peer_failure(rank))
      return fmt::format("{}: {}", failure->phase, failure->message);
  return std::nullopt;
}

void InProcessSession::ignore_peer(int rank, bool ignored) {
  if (!state_->counters) return;  // node peers send no signals
  const auto R = static_cast<uint32_t>(ranks()), r = static_cast<uint32_t>(rank);
  for (uint32_t key : {r, R + r, 2 * R + r})  // record, eager bytes, release (fabric_channel.hpp)
    state_->counters->ignore_key(key, ignored);
}

void InProcessSession::await_tolerant(const Wait& wait) {
  // The engine's own deadline is beyond the wait's: a tick ends its waits.
  const auto engine_deadline = Deadline(timeout_ + std::chrono::seconds(10));
  const std::function<std::string()> unreached = [] { return std::string("(not reached)"); };
  proxy::await_tolerant(*this, wait, timeout_, [&](const std::function<bool()>& ready_or_tick) {
    if (!state_->engine) {
      Poller poller;
      while (!ready_or_tick())
        poller.pause();
      return;
    }
    try {
      state_->engine->wait_until(ready_or_tick, engine_deadline, unreached);
    } catch (const Error& e) {
      fail(std::string(wait.phase), "{}", e.what());
    }
  });
}

void InProcessSession::quiet(std::string_view phase) {
  if (!state_->engine) return;
  drive_route(phase);  // the engine counts the pushes the stream made
  try {
    state_->engine->quiet(Deadline(timeout_));
  } catch (const Error& e) {
    fail(std::string(phase), "{}", e.what());
  }
}

void InProcessSession::await(const Wait& wait) {
  drive_route(wait.phase);  // what the peers answer may need this rank's writes
  if (wait.on_lost) {
    await_tolerant(wait);
    return;
  }
  const auto deadline = Deadline(timeout_);
  DepartureWatch watch(*this, wait, peers_);
  // Built only for messages: the polls allocate nothing.
  auto describe = [&] { return describe_missing(*this, wait, timeout_); };
  auto ready_or_departed = [&] { return wait.ready() || watch.departed(); };
  if (state_->engine) {
    try {
      state_->engine->wait_until(ready_or_departed, deadline,
                                 std::function<std::string()>(describe));
    } catch (const Error& e) {
      fail(std::string(wait.phase), "{}", e.what());
    }
  } else {
    poll_until(ready_or_departed, deadline, describe, wait.phase, watch);
  }
  if (!watch.departure().empty())
    fail(std::string(wait.phase), "{} while this rank waited for {}", watch.departure(), wait.what);
}

std::span<std::byte> InProcessSession::data_area() const {
  return {state_->node->local() + layout().data_base(), layout().sizes().data_bytes};
}

std::span<std::byte> InProcessSession::staging_data_area() const {
  if (!state_->staging || layout().sizes().data_bytes == 0) return {};  // no rows to stage
  return {static_cast<std::byte*>(state_->staging->host()) + layout().staging_data_base(),
          layout().sizes().staging_bytes};
}

std::vector<std::span<std::byte>> InProcessSession::row_memory() const {
  std::vector<std::span<std::byte>> regions = state_->node->all_mapped();
  if (state_->staging) regions.push_back(state_->staging->bytes());
  return regions;
}

std::string InProcessSession::describe() const {
  const ArenaLayout& l = layout();
  std::string out = fmt::format("{} ranks, {} per node, arena {} bytes ({} per source)", ranks(),
                                ranks_per_node(), l.arena_bytes(), l.source_area());
  if (l.sizes().spans_nodes())
    out += fmt::format(
        ", staging {} bytes, chunks of {} bytes between nodes, window {} "
        "(staging {})",
        l.staging_bytes(), l.remote_slots().slot_bytes, l.remote_slots().window, l.stage_window());
  return out;
}

}  // namespace proxyep::proxy
