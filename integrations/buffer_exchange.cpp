// Buffer::Impl: construction and the protocol steps every call shares (see buffer_impl.hpp).
#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "control/imm_layout.hpp"
#include "integrations/buffer_impl.hpp"
#include "proxy/region_exchange.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

constexpr uint64_t kRingSlots = 4096;
constexpr uint32_t kSpinsBeforeYield = 64;  // see wait_for()

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

template <typename T>
std::atomic_ref<T> shared_word(T& word) {
  return std::atomic_ref<T>(word);
}

int default_host_threads(int ranks_per_node) {
  int64_t configured = params::ep_host_threads.get();
  if (configured > 0) return static_cast<int>(std::min<int64_t>(configured, 64));
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  int share = static_cast<int>(std::max<long>(1, cores / std::max(1, ranks_per_node)));
  return std::min(share, 8);
}

// The options every rank must agree on, checked at construction.
struct Agreed {
  int64_t ranks_per_node;
  int64_t nvl_bytes;
  int64_t rdma_bytes;
  int64_t chunk_bytes;  // the chunk size of streams between nodes derives from it
  int64_t eager_bytes;  // the eager slots' size
};

}  // namespace

const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::dispatch:
      return "dispatch";
    case CallKind::cached_dispatch:
      return "dispatch (cached)";
    case CallKind::combine:
      return "combine";
  }
  return "?";
}

Buffer::Impl::Impl(control::Bootstrap& boot, const BufferOptions& opts)
    : bootstrap(boot), options(opts) {
  constexpr const char* phase = "buffer";
  require(!opts.low_latency_mode, phase,
          "low_latency_mode is not supported yet (ProxyEP implements normal mode)");
  rank = boot.rank();
  ranks = boot.world_size();
  ranks_per_node = opts.ranks_per_node > 0 ? opts.ranks_per_node : boot.env().local_world_size;
  // Nodes hold consecutive ranks; the last one may be smaller (3 ranks, 2 per node: {0, 1}, {2}).
  require(ranks_per_node >= 1, phase, "ranks_per_node must be >= 1; got {}", ranks_per_node);
  require(opts.num_nvl_bytes > 0 && opts.num_nvl_bytes % 128 == 0, phase,
          "num_nvl_bytes must be a positive multiple of 128 (this backend receives into it); got "
          "{}",
          opts.num_nvl_bytes);
  require(opts.num_rdma_bytes >= 0 && opts.num_rdma_bytes % 128 == 0, phase,
          "num_rdma_bytes must be a non-negative multiple of 128; got {}", opts.num_rdma_bytes);
  multi_node = ranks > ranks_per_node;
  require(!multi_node || opts.num_rdma_bytes > 0, phase,
          "the group spans {} nodes of {} ranks: num_rdma_bytes must be > 0 (it stages the rows "
          "sent to other nodes; see Buffer::rdma_bytes_hint)",
          ranks / ranks_per_node, ranks_per_node);
  timeout = std::chrono::milliseconds(params::ep_timeout_ms.get());
  const int64_t chunk_bytes = std::max<int64_t>(4096, params::ep_chunk_bytes.get());
  eager_bytes = static_cast<uint64_t>(std::max<int64_t>(0, params::ep_eager_bytes.get())) /
                ep::kAreaAlignment * ep::kAreaAlignment;
  executor = std::make_unique<ep::HostExecutor>(default_host_threads(ranks_per_node));

  Agreed mine{ranks_per_node, opts.num_nvl_bytes, opts.num_rdma_bytes, chunk_bytes,
              static_cast<int64_t>(eager_bytes)};
  auto agreed =
      boot.allgather(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&mine), sizeof mine),
                     "buffer(options)");
  for (int r = 0; r < ranks; ++r) {
    Agreed theirs{};
    require(agreed[static_cast<size_t>(r)].size() == sizeof theirs, phase,
            "rank {} sent malformed options", r);
    std::memcpy(&theirs, agreed[static_cast<size_t>(r)].data(), sizeof theirs);
    require(theirs.ranks_per_node == mine.ranks_per_node && theirs.nvl_bytes == mine.nvl_bytes &&
                theirs.rdma_bytes == mine.rdma_bytes && theirs.chunk_bytes == mine.chunk_bytes &&
                theirs.eager_bytes == mine.eager_bytes,
            phase,
            "rank {} created its Buffer with ranks_per_node {}, num_nvl_bytes {}, num_rdma_bytes "
            "{}, ep.chunk_bytes {}, ep.eager_bytes {}; rank {} with {}, {}, {}, {}, {}: every rank "
            "must pass the same",
            r, theirs.ranks_per_node, theirs.nvl_bytes, theirs.rdma_bytes, theirs.chunk_bytes,
            theirs.eager_bytes, rank, mine.ranks_per_node, mine.nvl_bytes, mine.rdma_bytes,
            mine.chunk_bytes, mine.eager_bytes);
  }

  record_bytes = align_up(
      sizeof(NotifyHeader) + 4ull * static_cast<uint64_t>(ranks) + 4ull * ep::kMaxLocalExperts, 64);
  eager_base = 2ull * static_cast<uint64_t>(ranks) * (record_bytes + 64);
  arena_control_bytes =
      align_up(eager_base + 2ull * static_cast<uint64_t>(ranks) * eager_bytes, 4096);
  geometry = StreamGeometry::make(
      rank, ranks, ranks_per_node, static_cast<uint64_t>(opts.num_nvl_bytes),
      static_cast<uint64_t>(opts.num_rdma_bytes), static_cast<uint64_t>(chunk_bytes));
  node = std::make_unique<proxy::NodeMemory>(
      boot, arena_control_bytes + static_cast<uint64_t>(opts.num_nvl_bytes), ranks_per_node, phase);

  if (multi_node) {
    fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(rank));
    boot.set_progress([this] { fabric->progress(); });
    fabric->connect(boot.allgather(fabric->addresses(), "buffer(fabric addresses)"));
    staging = std::make_unique<HostMemory>(
        HostMemory::heap(staging_data_offset() + static_cast<uint64_t>(opts.num_rdma_bytes)));
    arena_region = fabric->register_memory(node->local(), node->bytes());
    staging_region = fabric->register_memory(staging->host(), staging->size());
    require(geometry.stage_window > 0, phase,
            "num_rdma_bytes ({}) gives each destination on another node {} bytes, less than one "
            "{}-byte chunk",
            opts.num_rdma_bytes, geometry.stage_area, geometry.remote_slot);
    require(static_cast<uint64_t>(ranks) <= control::imm::kMaxStreams, phase,
            "{} ranks exceed the {} chunk streams an immediate can name", ranks,
            control::imm::kMaxStreams);
    counters = std::make_unique<control::CounterBank>(2u * static_cast<uint32_t>(ranks));
    router.attach_counters(*counters);
    windows.resize(static_cast<size_t>(ranks));
    credits.resize(static_cast<size_t>(ranks));
    consumed_total.assign(static_cast<size_t>(ranks), 0);
    staged_at.resize(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      if (node->on_node(r)) continue;
      windows[r] = std::make_unique<control::SequenceWindow>(geometry.remote_window);
      credits[r] = std::make_unique<control::SenderCredits>(geometry.remote_window);
      router.attach_stream(static_cast<uint32_t>(r), *windows[r]);
      router.attach_credits(static_cast<uint32_t>(r), *credits[r]);
      staged_at[r].assign(geometry.stage_window, kNeverPosted);
    }
    engine = std::make_unique<proxy::ProxyEngine>(*fabric, rank, ranks, router);
    proxy::share_region(boot, engine->regions(), kArenaRegion, *arena_region, phase);
    engine->regions().add_local(kStagingRegion, *staging_region);
    ring_memory =
        std::make_unique<HostMemory>(HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots)));
    auto ring = gpu_side::Ring::create(ring_memory->bytes(), kRingSlots);
    doorbell = std::make_unique<gpu_side::Doorbell>();
    ring_index = engine->add_ring(ring, doorbell.get());
    boot.barrier("buffer(fabric ready)");
    boot.set_progress({});  // the proxy threads own the rails from here on
    engine->start();
    producer = std::make_unique<gpu_side::RingProducer>(
        ring, gpu_side::ProducerOptions{.doorbell = doorbell.get()});
  }
  std::random_device entropy;
  id = (uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<uint64_t>(::getpid());
  boot.barrier("buffer(ready)");
  log::debug("buffer: {} ranks, {} per node, {} host threads, arena {} bytes ({} per source){}",
             ranks, ranks_per_node, executor->threads(), node->bytes(), geometry.source_area,
             multi_node
                 ? fmt::format(", staging {} bytes, chunks of {} bytes between nodes, window {} "
                               "(staging {})",
                               staging->size(), geometry.remote_slot, geometry.remote_window,
                               geometry.stage_window)
                 : "");
}

Buffer::Impl::~Impl() {
  stop_proxy();
}

void Buffer::Impl::stop_proxy() noexcept {
  if (!engine) return;
  producer.reset();
  engine->stop();
}

std::byte* Buffer::Impl::record_in(int owner, uint64_t call, int source) const {
  return node->peer(owner) +
         ((call % 2) * static_cast<uint64_t>(ranks) + static_cast<uint64_t>(source)) * record_bytes;
}

uint64_t* Buffer::Impl::published_word(int owner, int source) const {
  std::byte* base = node->peer(owner) + 2ull * static_cast<uint64_t>(ranks) * record_bytes;
  return reinterpret_cast<uint64_t*>(base + static_cast<uint64_t>(source) * 64);
}

uint64_t* Buffer::Impl::consumed_word(int owner, int receiver) const {
  std::byte* base = node->peer(owner) + 2ull * static_cast<uint64_t>(ranks) * record_bytes;
  return reinterpret_cast<uint64_t*>(base +
                                     (static_cast<uint64_t>(ranks) + receiver) * uint64_t{64});
}

uint64_t Buffer::Impl::slot_offset(int receiver, int source, const ChunkPlan& plan,
                                   uint64_t chunk) const {
  // Shares are by source, skipping the receiver itself (it never streams to itself).
  const uint64_t share = static_cast<uint64_t>(source < receiver ? source : source - 1);
  return share * geometry.source_area + (chunk % plan.window) * plan.slot_bytes;
}

std::byte* Buffer::Impl::staging_record(int destination) const {
  return static_cast<std::byte*>(staging->host()) +
         static_cast<uint64_t>(destination) * record_bytes;
}

uint64_t Buffer::Impl::staging_slot_offset(int destination, uint32_t slot) const {
  // Shares are by destination on another node, in rank order: this node's ranks (consecutive,
  // from `first`) have none.
  const int first = rank / ranks_per_node * ranks_per_node;
  const auto share = static_cast<uint64_t>(
      destination < first ? destination : destination - node_size(rank, ranks, ranks_per_node));
  return staging_data_offset() + share * geometry.stage_area +
         static_cast<uint64_t>(slot) * geometry.remote_slot;
}

void Buffer::Impl::check_usable(std::string_view phase) const {
  require(!destroyed, phase, "the Buffer was destroyed");
  if (!broken.empty())
    fail(std::string(phase),
         "an earlier call failed ({}); the ranks are out of step: create a new Buffer", broken);
  if (engine && engine->health().failed()) {
    auto failure = engine->health().failure();
    fail(std::string(phase), "the Buffer's proxy failed earlier ({}: {}); create a new Buffer",
         failure ? failure->phase : "?", failure ? failure->message : "?");
  }
}

uint64_t Buffer::Impl::begin_call() {
  uint64_t call = next_call++;
  ++stats.calls;
  if (counters && call > 0 && counters->begin_epoch(call) != Status::ok)
    fail("buffer", "call {}: writes of an earlier call were left over: {}", call,
         counters->last_leak());
  return call;
}

void Buffer::Impl::push(const gpu_side::Descriptor& descriptor, std::string_view phase) {
  if (producer->push(descriptor, Deadline(timeout)) != Status::ok)
    fail(std::string(phase),
         "the descriptor ring stayed full (a write to rank {}): the proxy made no progress "
         "before the deadline",
         descriptor.dst_rank);
  ++pushed;
}

void Buffer::Impl::post_write(int destination, uint64_t staging_offset, uint64_t arena_offset,
                              uint64_t length, uint64_t call, uint32_t imm,
                              std::string_view phase) {
  gpu_side::Descriptor desc;
  desc.op = length == 0 ? gpu_side::Op::signal : gpu_side::Op::write_imm;
  desc.dst_rank = static_cast<uint32_t>(destination);
  desc.local_region = kStagingRegion;
  desc.remote_region = kArenaRegion;
  desc.src_offset = staging_offset;
  desc.dst_offset = arena_offset;
  desc.length = length;
  desc.cookie = call;
  desc.imm = imm;
  push(desc, phase);
}

std::vector<Buffer::Impl::Record> Buffer::Impl::exchange_notify(
    uint64_t call, const NotifyHeader& header, std::span<const int32_t> rows_to,
    const std::function<std::span<const int32_t>(int)>& experts_for, std::string_view phase) {
  const size_t rows_bytes = 4ull * static_cast<size_t>(ranks);
  for (int d = 0; d < ranks; ++d) {
    NotifyHeader h = header;
    h.seq = call + 1;
    auto experts = experts_for ? experts_for(d) : std::span<const int32_t>{};
    require(experts.size() <= static_cast<size_t>(ep::kMaxLocalExperts), phase,
            "{} local experts per rank exceed the limit of {}", experts.size(),
            ep::kMaxLocalExperts);
    size_t used = sizeof h + rows_bytes + 4 * experts.size();
    if (node->on_node(d)) {
      std::byte* slot = record_in(d, call, rank);
      // Everything but the seq word first; the release store of seq publishes the record.
      std::memcpy(slot + sizeof h.seq, reinterpret_cast<const std::byte*>(&h) + sizeof h.seq,
                  sizeof h - sizeof h.seq);
      std::memcpy(slot + sizeof h, rows_to.data(), rows_bytes);
      if (!experts.empty())
        std::memcpy(slot + sizeof h + rows_bytes, experts.data(), 4 * experts.size());
      // Pairs with the acquire load in the receiver's wait below.
      shared_word(reinterpret_cast<NotifyHeader*>(slot)->seq)
          .store(call + 1, std::memory_order_release);
    } else {
      std::byte* slot = staging_record(d);
      std::memcpy(slot, &h, sizeof h);
      std::memcpy(slot + sizeof h, rows_to.data(), rows_bytes);
      if (!experts.empty())
        std::memcpy(slot + sizeof h + rows_bytes, experts.data(), 4 * experts.size());
      post_write(d, static_cast<uint64_t>(d) * record_bytes,
                 static_cast<uint64_t>(record_in(rank, call, rank) - node->local()), used, call,
                 control::imm::encode_counter(call, static_cast<uint32_t>(rank)), phase);
    }
  }
  for (int s = 0; s < ranks; ++s)
    if (!node->on_node(s) &&
        counters->set_expected(call, static_cast<uint32_t>(s), 1) != Status::ok)
      fail(std::string(phase), "notify from rank {}: {}", s, counters->last_error());

  auto arrived = [&](int s) {
    if (node->on_node(s))
      return shared_word(reinterpret_cast<NotifyHeader*>(record_in(rank, call, s))->seq)
                 .load(std::memory_order_acquire) == call + 1;
    return counters->ready(call, static_cast<uint32_t>(s));
  };
  await(
      [&] {
        for (int s = 0; s < ranks; ++s)
          if (!arrived(s)) return false;
        return true;
      },
      [&](int s) { return !arrived(s); }, phase, "the notify record (call start)");

  std::vector<Record> records(static_cast<size_t>(ranks));
  for (int s = 0; s < ranks; ++s) {
    const std::byte* slot = record_in(rank, call, s);
    Record& r = records[static_cast<size_t>(s)];
    std::memcpy(&r.header, slot, sizeof r.header);
    r.rows_to.resize(static_cast<size_t>(ranks));
    std::memcpy(r.rows_to.data(), slot + sizeof r.header, rows_bytes);
    uint32_t local_experts = r.header.num_experts / static_cast<uint32_t>(ranks);
    if (r.header.kind == static_cast<uint32_t>(CallKind::dispatch) && local_experts > 0 &&
        local_experts <= static_cast<uint32_t>(ep::kMaxLocalExperts)) {
      r.experts.resize(local_experts);
      std::memcpy(r.experts.data(), slot + sizeof r.header + rows_bytes, 4ull * local_experts);
    }
    // Eager rows from another node are counted whether or not this call goes on (a call that
    // fails on a disagreement must leave no write unexpected in the counter bank).
    if (!node->on_node(s) &&
        plan_stream(s, rank, static_cast<uint64_t>(std::max(0, r.rows_to[rank])), r.header.format)
            .eager &&
        counters->set_expected(call, static_cast<uint32_t>(ranks + s), 1) != Status::ok)
      fail(std::string(phase), "eager rows from rank {}: {}", s, counters->last_error());
  }
  return records;
}

ChunkPlan Buffer::Impl::plan_stream(int source, int destination, uint64_t rows,
                                    const ep::RowFormat& format) const {
  if (source == destination) return {};
  if (rows > 0 && ep::RowAreas::of(rows, format).end <= eager_bytes)
    return ChunkPlan::whole(rows, eager_bytes, /*eager=*/true);
  return node->on_node(source) && node->on_node(destination)
             ? plan_node_stream(rows, format, geometry)
             : plan_remote_stream(rows, format, geometry);
}

void Buffer::Impl::require_row_fits(const ep::RowFormat& format, std::string_view phase) const {
  std::string why;
  require(fits_one_row(format, geometry, multi_node, &why), phase, "{}", why);
}

void Buffer::Impl::quiet(std::string_view phase) {
  if (!engine) return;
  try {
    engine->quiet(Deadline(timeout));
  } catch (const Error& e) {
    fail(std::string(phase), "{}", e.what());
  }
}

void Buffer::Impl::await(const std::function<bool()>& ready,
                         const std::function<bool(int)>& pending, std::string_view phase,
                         std::string_view what, const std::function<std::string(int)>& detail) {
  auto deadline = Deadline(timeout);
  // Polled: no allocation here. The list of missing ranks is built only for messages and the
  // occasional liveness check.
  auto missing = [&] {
    std::vector<int> out;
    for (int s = 0; s < ranks; ++s)
      if (pending(s)) out.push_back(s);
    return out;
  };
  // A node peer that exited is reported at once instead of at the deadline.
  int dead = -1;
  auto last_check = std::chrono::steady_clock::now();
  uint32_t since_check = 0;
  auto check_peers = [&] {
    // Sticky: the engine's wait may consume one true answer in its sleep predicate.
    if (dead >= 0) return true;
    // Reading the clock on every poll cost ~4% of a small call; every 256th poll is enough.
    if (++since_check < 256) return false;
    since_check = 0;
    auto now = std::chrono::steady_clock::now();
    if (now - last_check < std::chrono::milliseconds(50)) return false;
    last_check = now;
    for (int r : missing())
      if (r != rank && node->on_node(r) && !node->peer_alive(r)) {
        dead = r;
        return true;
      }
    return false;
  };
  auto describe = [&] {
    auto ranks_missing = missing();
    std::string where;
    if (detail)
      for (int r : ranks_missing)
        where += fmt::format("; rank {}: {}", r, detail(r));
    return fmt::format("{} from rank(s) {} did not arrive within {} ms{}", what,
                       fmt::join(ranks_missing, ", "), timeout.count(), where);
  };
  if (engine) {
    try {
      engine->wait_until([&] { return ready() || check_peers(); }, deadline,
                         std::function<std::string()>(describe));
    } catch (const Error& e) {
      fail(std::string(phase), "{}", e.what());
    }
  } else {
    // Spin only briefly before yielding: the peer we wait for is often runnable on this very
    // core (a rank woken by our own message is placed next to us), and it runs only when we
    // yield. With a spin of 2000 pauses both ranks of a 2-core machine took ~360 us per call
    // after a barrier instead of ~20 us. Past ~20000 polls, short sleeps keep a long wait off
    // the cores.
    Backoff backoff(kSpinsBeforeYield);
    uint64_t polls = 0;
    while (!ready()) {
      if (check_peers()) break;
      if (since_check == 0 && deadline.expired()) fail(std::string(phase), "{}", describe());
      if (++polls < 20000)
        backoff.pause();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  if (dead >= 0)
    fail(std::string(phase), "rank {} (pid {}) on this node exited while this rank waited for {}",
         dead, node->peer_pid(dead), what);
}

}  // namespace proxyep
