// Buffer's private state and the protocol steps its calls share (buffer_exchange.cpp): the
// per-call notify exchange, row delivery to node peers (stores into their mapped arenas) and to
// other nodes (descriptors -> proxy -> fabric), and the waits. dispatch and combine
// (buffer_dispatch.cpp, buffer_combine.cpp) are written in terms of these steps.
//
// Arena of every rank (NodeMemory; registered with the fabric as region kArenaRegion):
//   [notify records: 2 parities x R sources] [done words: 2 parities x R sources] [data area]
// Staging of every rank with peers on other nodes (registered as kStagingRegion):
//   [notify records: R destinations] [data area: num_rdma_bytes]
//
// Call k (every dispatch or combine is one call; every rank numbers them identically):
// 1. notify: each rank writes a record (call kind, row format, rows it sends to every rank, per
//    expert counts for the destination's experts) into slot [k % 2][self] of every rank's arena:
//    node peers by stores + a release store of the record's seq; other nodes by an RMA write
//    with counter immediate (epoch k, key = source). Each rank then waits for all R records.
//    Receiving rank d's record proves d has finished call k-1 (including copying its rows out),
//    so d's data area is free for call k; two parities suffice because no rank can enter k+1
//    before every rank has entered k.
// 2. rows: written to their final offsets in the receiver's data area (row_format.hpp); node
//    peers get a release store of done[k % 2][self] afterwards, other nodes count writes:
//    key R + source expects exactly the number of writes the sender posts (same chunking rule
//    on both sides, chunk size carried in the record).
// 3. wait for every source's rows, copy out, and quiet (the staging area is rewritten next call).
#pragma once

#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/host_executor.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "gpu_side/ring.hpp"
#include "gpu_side/ring_memory.hpp"
#include "integrations/buffer.hpp"
#include "proxy/node_memory.hpp"
#include "proxy/proxy_engine.hpp"

#include <cstdint>
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
  ep::RowFormat format;
  uint32_t num_experts = 0;
  uint32_t expert_alignment = 0;
  uint64_t chunk_bytes = 0;
  uint32_t num_worst_tokens = 0;
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
  uint64_t chunk_bytes = 1 << 20;
  std::unique_ptr<ep::HostExecutor> executor;

  size_t record_bytes = 0;         // one notify record
  size_t arena_control_bytes = 0;  // notify records + done words
  std::unique_ptr<proxy::NodeMemory> node;
  bool multi_node = false;
  // Internode path (only when the group spans nodes).
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<gpu_side::RingMemory> staging;
  std::unique_ptr<fabric::MemoryRegion> arena_region, staging_region;
  std::unique_ptr<control::CounterBank> counters;
  control::SignalRouter router;
  // Declared before the engine, which releases its claim on the ring when destroyed.
  std::unique_ptr<gpu_side::RingMemory> ring_memory;
  std::unique_ptr<gpu_side::Doorbell> doorbell;
  std::unique_ptr<proxy::ProxyEngine> engine;
  std::unique_ptr<gpu_side::RingProducer> producer;

  uint64_t next_call = 0;

  // ---- layout of the shared memory ----
  std::byte* record_in(int owner, uint64_t call, int source) const;  // in owner's arena
  uint64_t* done_word(int owner, uint64_t call, int source) const;
  std::byte* data_area(int owner) const { return node->peer(owner) + arena_control_bytes; }
  uint64_t data_offset() const { return arena_control_bytes; }  // in the arena region
  size_t data_capacity() const { return node->bytes() - arena_control_bytes; }
  std::byte* staging_record(int destination) const;
  std::byte* staging_data() const;
  size_t staging_capacity() const;
  uint64_t staging_data_offset() const { return static_cast<uint64_t>(ranks) * record_bytes; }

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
  // Every write a source posts for `rows` rows of `format`, under the chunk rule.
  static uint64_t writes_for(uint64_t rows, const ep::RowFormat& format, uint64_t chunk_bytes);
  // Posts the rows packed in staging at `staging_offset` (areas for `rows` rows) to rank `dst`'s
  // data area, into an area laid out for `dst_rows` rows starting at row `dst_first`.
  // Returns the number of writes posted (== writes_for(rows, ...)).
  uint64_t post_rows(uint64_t call, int dst, uint64_t staging_offset, uint64_t rows,
                     uint64_t dst_first, uint64_t dst_rows, const ep::RowFormat& format,
                     std::string_view phase);
  // After the rows to node peer `dst` are stored: tells it (release store).
  void mark_done(uint64_t call, int dst);
  // Remote sources: the number of writes each posts to this rank this call.
  void expect_rows(uint64_t call, int source, uint64_t writes, std::string_view phase);
  // Waits until every source has delivered its rows (done word / counter flag); a timeout or a
  // dead peer throws naming the ranks still missing.
  void wait_rows(uint64_t call, std::span<const uint8_t> from, std::string_view phase);
  // Waits until every write this rank posted has completed (the staging area is free again).
  void quiet(std::string_view phase);
  // Waits until `arrived(s)` holds for every rank s, with the call's deadline, keeping the proxy
  // going; the ranks still missing are named in the error and checked for liveness.
  void wait_for(const std::function<bool(int)>& arrived, std::string_view phase,
                std::string_view what);
  // Checks, before anything is sent, that the rows for other nodes fit the staging area.
  void require_staging(std::span<const int32_t> rows_to, const ep::RowFormat& format,
                       std::string_view phase) const;
  // Stops the proxy threads (destroy() and the destructor).
  void stop_proxy() noexcept;

  void check_usable(std::string_view phase) const;

  // ---- the calls (buffer_dispatch.cpp, buffer_combine.cpp) ----
  ep::EpShape shape_for(int num_experts) const { return {ranks, ranks_per_node, num_experts}; }
  DispatchResult dispatch(const DispatchArgs& args);
  CombineResult combine(const CombineArgs& args);
};

}  // namespace proxyep
