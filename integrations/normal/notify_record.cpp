// The notify record's wire format (notify_record.hpp).
#include "integrations/normal/notify_record.hpp"

#include "common/error.hpp"
#include "common/wire.hpp"
#include "gpu_side/ep/ep_shape.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

namespace {

constexpr uint32_t kRecordMagic = 0x524e5850;  // "PXNR" read as little-endian bytes
constexpr uint16_t kRecordVersion = 4;
constexpr uint64_t kFixedBytes = 4 + 2 + 2 + 4 + 5 * 4 + 3 * 4 + 4 * 8 + 2 * 4 + 4 + 4 + 4;

std::vector<int32_t> read_counts(ByteReader& r, uint32_t at_most, const char* what, int from,
                                 std::string_view phase) {
  const uint32_t n = r.u32(what);
  require(n <= at_most, phase, "the record from rank {} claims {} {}, at most {} fit", from, n,
          what, at_most);
  std::vector<int32_t> out(n);
  r.i32s(out, what);
  return out;
}

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

uint64_t record_payload_bytes(int ranks) {
  return kFixedBytes + 4ull * static_cast<uint64_t>(ranks) + 4ull * ep::kMaxLocalExperts;
}

void RecordEncoder::begin(const RecordHeader& h, std::span<const int64_t> rows_to) {
  common_.clear();
  ByteWriter w(common_);
  w.u32(kRecordMagic);
  w.u16(kRecordVersion);
  w.u16(static_cast<uint16_t>(h.kind));
  w.u32(h.num_tokens);
  for (uint32_t v : {h.format.hidden_bytes, h.format.scale_cols, h.format.topk, h.format.weights,
                     h.format.src_index, h.num_experts, h.expert_alignment, h.num_worst_tokens})
    w.u32(v);
  for (const LandingBlocks::Run& run : {h.landing.fitted, h.landing.largest}) {
    w.u64(run.offset);
    w.u64(run.bytes);
  }
  w.u32(h.fabric_chunking.send_rows);
  w.u32(h.fabric_chunking.recv_rows);
  // Row counts of one call are below 2^24 (proxy::kMaxStreamChunks): they fit an int32.
  w.u32(static_cast<uint32_t>(rows_to.size()));
  for (int64_t rows : rows_to)
    w.u32(static_cast<uint32_t>(static_cast<int32_t>(rows)));
}

uint64_t RecordEncoder::write(std::span<std::byte> slot, std::span<const int32_t> experts,
                              std::string_view phase, int32_t fabric_rows) const {
  ByteWriter w(slot, phase);
  w.bytes(common_);
  w.u32(static_cast<uint32_t>(experts.size()));
  w.i32s(experts);
  w.u32(static_cast<uint32_t>(fabric_rows));
  return w.written();
}

NotifyRecord decode_record(std::span<const std::byte> payload, int ranks, int from,
                           std::string_view phase) {
  ByteReader r({reinterpret_cast<const uint8_t*>(payload.data()), payload.size()},
               std::string(phase));
  const uint32_t magic = r.u32("magic");
  const uint16_t version = r.u16("version");
  require(magic == kRecordMagic && version == kRecordVersion, phase,
          "the record from rank {} has magic {:#x} version {} (expected {:#x} version {}): "
          "another ProxyEP build, or a torn record",
          from, magic, version, kRecordMagic, kRecordVersion);
  NotifyRecord rec;
  RecordHeader& h = rec.header;
  h.kind = static_cast<CallKind>(r.u16("kind"));
  require(h.kind == CallKind::dispatch || h.kind == CallKind::cached_dispatch ||
              h.kind == CallKind::combine,
          phase, "the record from rank {} names an unknown call kind {}", from,
          static_cast<uint32_t>(h.kind));
  h.num_tokens = r.u32("num_tokens");
  h.format.hidden_bytes = r.u32("hidden_bytes");
  h.format.scale_cols = r.u32("scale_cols");
  h.format.topk = r.u32("topk");
  h.format.weights = r.u32("weights");
  h.format.src_index = r.u32("src_index");
  h.num_experts = r.u32("num_experts");
  h.expert_alignment = r.u32("expert_alignment");
  h.num_worst_tokens = r.u32("num_worst_tokens");
  for (LandingBlocks::Run* run : {&h.landing.fitted, &h.landing.largest}) {
    run->offset = r.u64("landing offset");
    run->bytes = r.u64("landing bytes");
  }
  h.fabric_chunking.send_rows = r.u32("fabric send_rows");
  h.fabric_chunking.recv_rows = r.u32("fabric recv_rows");
  const FabricChunking& c = h.fabric_chunking;
  require(c.none() ? c.recv_rows == 0 : c.recv_rows >= c.send_rows, phase,
          "the record from rank {} chunks its streams to other nodes by {} rows with {} in "
          "flight",
          from, c.send_rows, c.recv_rows);
  rec.rows_to = read_counts(r, static_cast<uint32_t>(ranks), "rows_to", from, phase);
  require(rec.rows_to.size() == static_cast<size_t>(ranks), phase,
          "the record from rank {} counts rows for {} ranks, the group has {}", from,
          rec.rows_to.size(), ranks);
  rec.experts = read_counts(r, ep::kMaxLocalExperts, "experts", from, phase);
  rec.fabric_rows = static_cast<int32_t>(r.u32("fabric_rows"));
  require(rec.fabric_rows >= 0, phase, "the record from rank {} announces {} fabric rows", from,
          rec.fabric_rows);
  return rec;
}

}  // namespace proxyep::integrations::normal
