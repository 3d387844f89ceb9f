// The rows of a hierarchical internode dispatch (proxy/session/arena_layout.hpp), as streams over
// every channel the session hands out:
//   node peer q        this rank's tokens to q, as per_rank (DispatchStreams);
//   counterpart c      this rank's tokens to c's node, each once, in token order, as forwarder
//                      rows: the global expert ids and weights as they are, and the token's
//                      heads there (its position among this rank's rows to each rank of that
//                      node, -1: not for it);
//   relay lane x       out: the rows of this rank's counterpart on x's node for the node peer
//                      the lane reaches, taken from that counterpart's forwarder rows once they
//                      arrived (rows_ready), packed by the same rule as a direct send, the
//                      source token index passed through; in: the rows of rank x itself, which
//                      its forwarder here sends under x's key, so they land in x's place of the
//                      receive layout as any source's (DispatchStreams::take).
// A counterpart's forwarder rows are copied out of their slots as they arrive (so the slots go
// back at once and the two hops never wait for each other's credits): this rank's own rows go
// to its outputs, the others wait in a buffer until their lane's chunk can be filled.
//
// Device calls: the rows, the forwarded rows and the heads the pack rule reads are in the
// device's memory and every copy and pack runs on its stream, as a direct send's. The host reads
// one thing: each arriving chunk's heads (where its rows go), which it copies out of the slot
// and waits for before it routes them (one wait per fabric chunk).
#pragma once

#include "integrations/normal/dispatch_rows.hpp"
#include "integrations/normal/notify_record.hpp"
#include "proxy/session/session.hpp"

#include <cstdint>
#include <vector>

namespace proxyep::integrations::normal {

// Where a source's tokens cross to each other node: each token once per node that holds one of
// its experts, in token order.
struct NodeRouting {
  std::vector<std::vector<int32_t>> tokens_to;  // by node (this rank's own: empty)
  std::vector<int64_t> rows_to;                 // by node

  static NodeRouting of(const TokenRouting& routing, const proxy::ArenaLayout& layout);
};

class HierDispatchStreams final : public DispatchStreams {
 public:
  // `records`: every rank's record of the call (hier_notify.hpp).
  // `on_device`: as DispatchStreams'.
  HierDispatchStreams(RowBackend& backend, const DispatchInput& input, const DispatchArgs& args,
                      const TokenRouting& routing, const gpu_side::ep::EpShape& shape,
                      const proxy::Session& session, bool on_device);

  const NodeRouting& nodes() const { return nodes_; }
  // The call's format plus the heads a forwarder reads.
  const gpu_side::ep::RowFormat& fabric_format() const { return fabric_format_; }

  // The plans of this rank's own rows (to its node peers and counterparts), before the records:
  // eager only between this node's ranks (the fabric hop streams in chunks).
  void plan_sends();
  // The rest from the agreed records (chunk_plan.hpp): the lanes' (a forwarder's rows exist only
  // after the records, so never eager) and every received stream.
  void plan(const std::vector<NotifyRecord>& records);

  const gpu_side::ep::RowFormat& stream_format(int peer) const override;
  bool rows_ready(int destination, uint64_t end) const override;
  void fill(int destination, uint64_t first, uint64_t rows, std::byte* slot) override;
  void take(int source, uint64_t chunk, uint64_t first, uint64_t rows,
            const std::byte* slot) override;

  // What this rank forwards, for the handle its combine reads: by counterpart (rank order), the
  // forwarder rows' heads (i32 [rows, ranks_per_node] each, in arrival order), filled as the
  // rows arrive (after plan()).
  std::vector<gpu_side::ep::Tensor> forward_heads() const;
  // Likewise the forwarded rows' order of this node's ranks (DispatchHandle::forward_orders);
  // empty without top-k.
  std::vector<gpu_side::ep::Tensor> forward_orders() const;
  // Rows this rank sent to other nodes (each token once per node) and forwarded inside its own.
  uint64_t rows_to_fabric() const;
  uint64_t rows_forwarded() const { return rows_forwarded_; }

 private:
  // A counterpart's forwarder rows as they arrived, laid out as RowAreas of all of them.
  struct Arrived {
    gpu_side::ep::Tensor area;   // u8: the rows as RowAreas of the call's format
    gpu_side::ep::Tensor heads;  // i32 [rows, ranks_per_node] (the handle keeps it)
    // With top-k: the rows' global expert ids, host copies (i64 [rows, topk]), and V2's order
    // of this node's ranks for each row (i32 [rows, ranks_per_node]: the handle keeps it).
    gpu_side::ep::Tensor topk, orders;
    gpu_side::ep::RowAreas areas;
    int64_t rows = 0;
    int64_t own = 0;  // of them, rows for this rank placed so far
    int64_t own_expected = 0;
    RowSource source;
  };

  bool counterpart(int r) const { return layout_.fabric_peer(r); }
  bool lane(int r) const { return !layout_.on_node(r) && !layout_.fabric_peer(r); }
  // A lane's counterpart (the source of its rows) and destination (the node peer it reaches).
  int lane_source(int x) const;
  void fill_fabric(int c, uint64_t first, uint64_t rows, std::byte* slot);
  void fill_lane(int x, uint64_t first, uint64_t rows, std::byte* slot);

  const proxy::ArenaLayout& layout_;
  const proxy::Session& session_;
  gpu_side::ep::RowFormat fabric_format_;
  // The routing's send_head where the backend's pack reads it (a device call's: a copy in device
  // memory, made once per call), for the forwarder rows' heads.
  gpu_side::ep::Tensor send_head_;
  NodeRouting nodes_;
  std::vector<Arrived> arrived_;                 // by rank: counterparts only
  std::vector<std::vector<int32_t>> lane_rows_;  // by lane: rows of its counterpart's Arrived
  uint64_t rows_forwarded_ = 0;
};

}  // namespace proxyep::integrations::normal
