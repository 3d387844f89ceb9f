// Buffer's private state and the protocol steps its calls share: the per-call notify exchange
// (buffer_exchange.cpp) and the chunk streams that carry the rows (buffer_streams.cpp, sizes in
// chunk_plan.hpp). dispatch and combine (buffer_dispatch.cpp, buffer_combine.cpp) are written in
// terms of these steps.
//
// Arena of every rank (NodeMemory; registered with the fabric as region kArenaRegion):
//   [notify records: 2 parities x R sources] [stream words: R published, R consumed]
//   [eager slots: 2 parities x R sources] [data area: one share per source (R - 1 shares),
//   each holding that source's chunk slots]
// Staging of every rank with peers on other nodes (registered as kStagingRegion):
//   [notify records: R destinations] [eager slots: 2 parities x R destinations]
//   [data area: one share per destination on another node]
//
// Call k (every dispatch or combine is one call; every rank numbers them identically):
// 1. notify: each rank writes a record (call kind, row format, rows it sends to every rank, per
//    expert counts for the destination's experts) into slot [k % 2][self] of every rank's arena:
//    node peers by stores + a release store of the record's seq; other nodes by an RMA write
//    with counter immediate (epoch k, key = source). Each rank then waits for all R records.
//    Receiving rank d's record proves d has finished call k-1 (every chunk consumed, the rows
//    reduced), so all of d's slots are free for call k; two parities suffice because no rank
//    can enter k+1 before every rank has entered k.
//    Eager rows: a pair whose rows fit ep.eager_bytes travels before its record, into the
//    receiver's eager slot [k % 2][source] (a stream of one chunk that needs no credit): the
//    record for k - 1 the sender received proves the receiver finished k - 2, the last user of
//    that slot. Node peers: stores, published by the record's release store; other nodes: one
//    RMA write with counter immediate (epoch k, key R + source). Small calls thus need one
//    exchange instead of two.
// 2. rows: every pair is a chunk stream (chunk_plan.hpp) driven by one loop that writes what the
//    receivers' credits allow and consumes what has arrived, until both directions are done.
//    Node peers: the sender stores a chunk into its slot in the receiver's arena, then
//    release-stores published[sender] there; the receiver copies it out and release-stores
//    consumed[receiver] in the sender's arena (its credit). Words hold (k + 1) << 24 | count.
//    Other nodes: the sender packs a chunk into a staging slot and posts one RMA write with a
//    stream immediate (stream = sender, sequence = its chunk number); the receiver's
//    SequenceWindow yields the landed prefix, and it returns credits (signal immediates,
//    stream = receiver) to the sender's SenderCredits. A staging slot is rewritten only after
//    the ring position of the write that read it has retired (local completion).
// 3. quiet: every write this rank posted has completed (notify records are rewritten next call).
#pragma once

#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/sequence_window.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/host_executor.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "gpu_side/ring.hpp"
#include "integrations/buffer.hpp"
#include "integrations/chunk_plan.hpp"
#include "proxy/node_memory.hpp"
#include "proxy/proxy_engine.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace proxyep {

enum class CallKind : uint32_t { dispatch = 1, cached_dispatch = 2, combine = 3 };
const char* call_name(CallKind kind);

// Rows rank s sent to rank d at the dispatch that made `handle` (from its inclusive prefix).
inline int64_t rows_sent(const DispatchHandle& handle, int s, int d) {
  const auto* prefix = handle.rank_prefix_matrix.data<int32_t>();
  const int64_t R = handle.rank_prefix_matrix.rows();
  return prefix[s * R + d] - (s > 0 ? prefix[(s - 1) * R + d] : 0);
}

// Fixed part of a notify record; followed by int32 rows[R] and int32 experts[kMaxLocalExperts].
struct alignas(64) NotifyHeader {
  uint64_t seq = 0;  // call + 1; stored last (release) on the intranode path
  uint32_t kind = 0;
  uint32_t num_tokens = 0;
  gpu_side::ep::RowFormat format;
  uint32_t num_experts = 0;
  uint32_t expert_alignment = 0;
  uint64_t chunk_bytes = 0;
  uint32_t num_worst_tokens = 0;
};

// Most rows one stream carries in a call (the stream words count chunks in 24 bits).
inline constexpr int64_t kMaxStreamRows = (int64_t{1} << 24) - 1;

// One call's rows as chunk streams (buffer_streams.cpp). `fill` writes rows [first, first +
// rows) of the stream to `destination` into `slot`, laid out as ep::RowAreas of `rows` rows;
// `take` consumes chunk `chunk` from `source` out of its slot before the slot is handed back.
// `local` runs once, after the first chunks are on their way (e.g. a rank's rows to itself).
struct Transfer {
  gpu_side::ep::RowFormat format;
  std::vector<ChunkPlan> out;  // by destination (self: no chunks)
  std::vector<ChunkPlan> in;   // by source (self: no chunks)
  std::function<void(int destination, uint64_t first, uint64_t rows, std::byte* slot)> fill;
  std::function<void(int source, uint64_t chunk, uint64_t first, uint64_t rows,
                     const std::byte* slot)>
      take;
  std::function<void()> local;
};

struct Buffer::Impl {
  static constexpr uint32_t kArenaRegion = 0;
  static constexpr uint32_t kStagingRegion = 1;

  Impl(control::Bootstrap& bootstrap, const BufferOptions& options);
  ~Impl();

  // ---- setup ----
  control::Bootstrap& bootstrap;
  BufferOptions options;
  int rank = 0, ranks = 1, ranks_per_node = 1;
  uint64_t id = 0;  // for handles: which Buffer made them
  bool destroyed = false;
  std::chrono::milliseconds timeout{100000};
  std::unique_ptr<gpu_side::ep::HostExecutor> executor;

  size_t record_bytes = 0;         // one notify record
  uint64_t eager_bytes = 0;        // one eager slot (ep.eager_bytes; 0 = no eager rows)
  uint64_t eager_base = 0;         // in the arena: 2 parities x R sources x eager_bytes
  size_t arena_control_bytes = 0;  // notify records + stream words + eager slots
  std::unique_ptr<proxy::NodeMemory> node;
  bool multi_node = false;
  StreamGeometry geometry;
  // Internode path (only when the group spans nodes).
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<HostMemory> staging;
  std::unique_ptr<fabric::MemoryRegion> arena_region, staging_region;
  // Notify records: key = source; eager rows: key = R + source.
  std::unique_ptr<control::CounterBank> counters;
  std::vector<std::unique_ptr<control::SequenceWindow>> windows;  // by source on another node
  std::vector<std::unique_ptr<control::SenderCredits>> credits;   // by destination, likewise
  std::vector<uint64_t> consumed_total;  // by source on another node: chunks consumed, ever
  // By destination on another node: ring position of the write that last read each staging
  // slot (kNeverPosted before the first).
  std::vector<std::vector<uint64_t>> staged_at;
  static constexpr uint64_t kNeverPosted = ~uint64_t{0};
  control::SignalRouter router;
  // Declared before the engine, which releases its claim on the ring when destroyed.
  std::unique_ptr<HostMemory> ring_memory;
  std::unique_ptr<gpu_side::Doorbell> doorbell;
  std::unique_ptr<proxy::ProxyEngine> engine;
  std::unique_ptr<gpu_side::RingProducer> producer;
  size_t ring_index = 0;  // in the engine
  uint64_t pushed = 0;    // descriptors pushed so far = the ring position of the next one

  uint64_t next_call = 0;
  BufferStats stats;
  // Set when a call failed in a step that leaves the ranks out of step (a timeout, a peer gone,
  // writes left over): every later call refuses, naming it.
  std::string broken;

  // Runs `step` of a call; an Error from it breaks the Buffer (see `broken`) and propagates.
  template <typename Step>
  decltype(auto) breaking_step(Step&& step) {
    try {
      return step();
    } catch (const Error& e) {
      broken = e.what();
      throw;
    }
  }

  // ---- layout of the shared memory ----
  std::byte* record_in(int owner, uint64_t call, int source) const;  // in owner's arena
  // In owner's arena: chunks `source` has published there / `receiver` has consumed of owner's.
  uint64_t* published_word(int owner, int source) const;
  uint64_t* consumed_word(int owner, int receiver) const;
  std::byte* data_area(int owner) const { return node->peer(owner) + arena_control_bytes; }
  uint64_t data_offset() const { return arena_control_bytes; }  // in the arena region
  size_t data_capacity() const { return node->bytes() - arena_control_bytes; }
  // Offset, in receiver's data area, of slot `chunk % window` of source's share.
  uint64_t slot_offset(int receiver, int source, const ChunkPlan& plan, uint64_t chunk) const;
  std::byte* staging_record(int destination) const;
  uint64_t staging_data_offset() const {
    return static_cast<uint64_t>(ranks) * record_bytes + 2ull * ranks * eager_bytes;
  }
  // Call `call`'s eager slot for rows from `source`, in any rank's arena (an offset); and this
  // rank's staging slot for eager rows to `destination` (an offset in the staging region).
  uint64_t eager_offset(int source, uint64_t call) const {
    return eager_base + ((call % 2) * ranks + static_cast<uint64_t>(source)) * eager_bytes;
  }
  uint64_t staging_eager_offset(int destination, uint64_t call) const {
    return static_cast<uint64_t>(ranks) * record_bytes +
           ((call % 2) * ranks + static_cast<uint64_t>(destination)) * eager_bytes;
  }
  // Offset in the staging region of this rank's staging slot `slot` for `destination`.
  uint64_t staging_slot_offset(int destination, uint32_t slot) const;

  // ---- a call's steps ----
  // Starts call k: advances the counter epoch. Returns k.
  uint64_t begin_call();
  // Sends `header` + rows_to[R] + experts_for(destination) to every rank and waits for every
  // rank's record of this call. `experts_for(d)` gives the counts for d's local experts (may be
  // empty). Returns the records, indexed by source.
  struct Record {
    NotifyHeader header;
    std::vector<int32_t> rows_to;  // [R]
    std::vector<int32_t> experts;  // [E_local of this rank], empty when not sent
  };
  std::vector<Record> exchange_notify(
      uint64_t call, const NotifyHeader& header, std::span<const int32_t> rows_to,
      const std::function<std::span<const int32_t>(int)>& experts_for, std::string_view phase);
  // The plan of the stream from `source` to `destination` for `rows` rows of `format`.
  ChunkPlan plan_stream(int source, int destination, uint64_t rows,
                        const gpu_side::ep::RowFormat& format) const;
  // Checks, before anything is sent, that a row of `format` fits the Buffer's slots.
  void require_row_fits(const gpu_side::ep::RowFormat& format, std::string_view phase) const;
  // Before the notify records of call `call`: writes the rows of every eager stream of
  // `transfer` (node peers: stores, published by the record's release store; other nodes: one
  // RMA write with counter immediate key R + this rank).
  void send_eager(uint64_t call, Transfer& transfer, std::string_view phase);
  // Moves every stream of `transfer` (buffer_streams.cpp): returns when this rank has sent every
  // chunk and consumed every chunk sent to it. A peer that stops making progress for
  // ep.timeout_ms, or a node peer that exits, fails the call naming it.
  void run_transfer(uint64_t call, Transfer& transfer, std::string_view phase);
  // Waits until every write this rank posted has completed (the staging area is free again).
  void quiet(std::string_view phase);
  // Waits until `ready()` holds, keeping the proxy going, with a deadline of ep.timeout_ms.
  // `pending(r)` says whether rank r is one this rank still waits for: those are named in the
  // error and node peers among them are checked for liveness.
  // `detail(r)`, when given, says where rank r stands (appended to the timeout message).
  void await(const std::function<bool()>& ready, const std::function<bool(int)>& pending,
             std::string_view phase, std::string_view what,
             const std::function<std::string(int)>& detail = {});
  // Pushes one descriptor (counts it in `pushed`).
  void push(const gpu_side::Descriptor& descriptor, std::string_view phase);
  // Posts `length` bytes at `staging_offset` of the staging region to `arena_offset` of rank
  // `destination`'s arena, carrying `imm`; with length 0, only the immediate (a signal).
  void post_write(int destination, uint64_t staging_offset, uint64_t arena_offset, uint64_t length,
                  uint64_t call, uint32_t imm, std::string_view phase);
  // Stops the proxy threads (destroy() and the destructor).
  void stop_proxy() noexcept;

  void check_usable(std::string_view phase) const;

  // ---- the calls (buffer_dispatch.cpp, buffer_combine.cpp) ----
  gpu_side::ep::EpShape shape_for(int num_experts) const {
    return {ranks, ranks_per_node, num_experts};
  }
  DispatchResult dispatch(const DispatchArgs& args);
  CombineResult combine(const CombineArgs& args);
};

}  // namespace proxyep
