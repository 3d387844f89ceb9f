// The LL record's wire format (ll_record.hpp).
#include "integrations/low_latency/ll_record.hpp"

#include "common/error.hpp"
#include "common/wire.hpp"
#include "gpu_side/ep/ep_shape.hpp"

#include <fmt/format.h>

namespace proxyep::integrations::low_latency {

namespace {

constexpr uint32_t kMagic = 0x4c4c5850;  // "PXLL" read as little-endian bytes
constexpr uint16_t kVersion = 1;
constexpr uint64_t kFixedBytes = 4 + 2 + 2 + 4 * 4 + 8 + 4;

}  // namespace

const char* kind_name(LlKind kind) {
  switch (kind) {
    case LlKind::agree:
      return "clean_low_latency_buffer (agreement on the sizes)";
    case LlKind::dispatch:
      return "low_latency_dispatch";
    case LlKind::combine:
      return "low_latency_combine";
  }
  return "?";
}

std::string describe(const LlShape& s) {
  return fmt::format("num_max_dispatch_tokens_per_rank {}, hidden {}, num_experts {}", s.tokens,
                     s.hidden, s.experts);
}

uint64_t ll_record_payload_bytes() {
  return kFixedBytes + 4ull * gpu_side::ep::kMaxLocalExperts;
}

uint64_t encode_ll_record(const LlRecord& rec, std::span<std::byte> slot, std::string_view phase) {
  ByteWriter w(slot, phase);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(rec.kind));
  w.u32(static_cast<uint32_t>(rec.shape.tokens));
  w.u32(static_cast<uint32_t>(rec.shape.hidden));
  w.u32(static_cast<uint32_t>(rec.shape.experts));
  w.u32(rec.flags);
  w.u64(rec.eager_bytes);
  w.u32(static_cast<uint32_t>(rec.counts.size()));
  w.i32s(rec.counts);
  return w.written();
}

LlRecord decode_ll_record(std::span<const std::byte> payload, int from, std::string_view phase) {
  ByteReader r(payload, std::string(phase));
  const uint32_t magic = r.u32("magic");
  require(magic == kMagic, phase,
          "rank {} is not in a low-latency call (its record is of another kind: a normal-mode "
          "call, or another ProxyEP version): every rank must make the same calls in the same "
          "order",
          from);
  const uint16_t version = r.u16("version");
  require(version == kVersion, phase,
          "rank {} sent a low-latency record of version {} (this build reads {})", from, version,
          kVersion);
  LlRecord rec;
  const uint16_t kind = r.u16("kind");
  require(kind >= 1 && kind <= 3, phase, "rank {} sent a low-latency record of unknown kind {}",
          from, kind);
  rec.kind = static_cast<LlKind>(kind);
  rec.shape.tokens = static_cast<int>(r.u32("T"));
  rec.shape.hidden = static_cast<int>(r.u32("hidden"));
  rec.shape.experts = static_cast<int>(r.u32("experts"));
  rec.flags = r.u32("flags");
  rec.eager_bytes = r.u64("eager bytes");
  const uint32_t n = r.u32("counts");
  require(n <= static_cast<uint32_t>(gpu_side::ep::kMaxLocalExperts), phase,
          "the record from rank {} claims {} expert counts, at most {} fit", from, n,
          gpu_side::ep::kMaxLocalExperts);
  rec.counts.resize(n);
  r.i32s(rec.counts, "counts");
  return rec;
}

}  // namespace proxyep::integrations::low_latency
