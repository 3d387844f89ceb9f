// The notify record: what a rank announces to every rank at the start of a normal-mode call (the
// kind of call, the row format, the rows it sends to every rank, and the per-expert counts of the
// destination's experts). Its wire format is versioned and size-checked, so a rank running
// another build, or a record torn by a bug, fails loudly instead of misplacing rows.
//
// Wire format (little endian, common/wire.hpp), in the payload of a record slot:
//   u32 magic "PXNR" | u16 version | u16 kind | u32 num_tokens |
//   u32 hidden_bytes | u32 scale_cols | u32 topk | u32 weights | u32 src_index |
//   u32 num_experts | u32 expert_alignment | u32 num_worst_tokens |
//   u64 fitted offset | u64 fitted bytes | u64 largest offset | u64 largest bytes |
//   u32 fabric send_rows | u32 fabric recv_rows |
//   u32 ranks R | i32 rows_to[R] | u32 experts n | i32 experts[n] | i32 fabric_rows
// The slot's capacity (record_payload_bytes) is fixed by the group size: R rows and up to
// kMaxLocalExperts expert counts.
#pragma once

#include "gpu_side/ep/row_format.hpp"
#include "integrations/normal/chunk_plan.hpp"
#include "integrations/normal/landing_blocks.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations::normal {

enum class CallKind : uint32_t { dispatch = 1, cached_dispatch = 2, combine = 3 };
const char* call_name(CallKind kind);

// The fixed fields of a record.
struct RecordHeader {
  CallKind kind = CallKind::dispatch;
  uint32_t num_tokens = 0;
  gpu_side::ep::RowFormat format;
  uint32_t num_experts = 0;
  uint32_t expert_alignment = 0;
  uint32_t num_worst_tokens = 0;
  // A dispatch's offer of free runs of the sender's landing region (landing_zone.hpp) for its
  // recv_x; runs of 0 bytes: none.
  LandingBlocks::Offer landing;
  // The chunks of the sender's streams to other nodes in this call (its Config's RDMA chunk
  // sizes), which their receivers plan with.
  FabricChunking fabric_chunking;
};

struct NotifyRecord {
  RecordHeader header;
  std::vector<int32_t> rows_to;  // [R]: rows the sender sends to each rank in this call
  // The receiver's local experts' counts (dispatch), else empty; hierarchical internode, from a
  // counterpart: those of every rank of the receiver's node, by local rank.
  std::vector<int32_t> experts;
  // Hierarchical internode, from a counterpart: the rows it sends the receiver's node (each
  // token once; ArenaLayout's forwarding); else 0.
  int32_t fabric_rows = 0;
};

// The payload bytes a record of a group of `ranks` needs at most.
uint64_t record_payload_bytes(int ranks);

// Encodes a call's records: the part every destination gets alike once, then each
// destination's record straight into its slot. Reused across calls, it allocates nothing once
// it has grown.
class RecordEncoder {
 public:
  void begin(const RecordHeader& header, std::span<const int64_t> rows_to);
  // Writes the record for a destination whose local experts' counts are `experts` (and, a
  // counterpart's, `fabric_rows`) into `slot`; returns its size. Throws proxyep::Error(phase)
  // when it does not fit.
  uint64_t write(std::span<std::byte> slot, std::span<const int32_t> experts,
                 std::string_view phase, int32_t fabric_rows = 0) const;

 private:
  std::vector<uint8_t> common_;
};

// Decodes the record rank `from` sent in a group of `ranks`. Throws proxyep::Error(phase)
// naming `from` for a record of another format or version, or a malformed one.
NotifyRecord decode_record(std::span<const std::byte> payload, int ranks, int from,
                           std::string_view phase);

}  // namespace proxyep::integrations::normal
