// The low-latency record: what a rank announces to every rank in each LL call (and in the
// agreement on the LL sizes). It travels in the session's record slot of the call; the messages
// themselves travel as the call's eager bytes (ll_wire.hpp). Versioned and size-checked like
// the normal mode's notify record, whose magic differs, so ranks in different modes fail
// loudly instead of misreading each other.
//
// Wire format (little endian, common/wire.hpp), in the payload of a record slot:
//   u32 magic "PXLL" | u16 version | u16 kind | u32 T | u32 hidden | u32 experts |
//   u32 flags (bit 0 fp8, 1 round_scale, 2 ue8m0) | u64 eager bytes |
//   u32 n | i32 counts[n]          (dispatch: messages per local expert of the receiver)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::integrations::low_latency {

enum class LlKind : uint16_t { agree = 1, dispatch = 2, combine = 3 };
const char* kind_name(LlKind kind);

// The sizes an LL call is made for: every rank must use the same (agreed once per change).
struct LlShape {
  int tokens = 0;   // num_max_dispatch_tokens_per_rank (T)
  int hidden = 0;   // H
  int experts = 0;  // E
  friend bool operator==(const LlShape&, const LlShape&) = default;
};
std::string describe(const LlShape& shape);

struct LlRecord {
  LlKind kind = LlKind::agree;
  LlShape shape;
  uint32_t flags = 0;
  uint64_t eager_bytes = 0;     // the messages that went with it (0: none)
  std::vector<int32_t> counts;  // dispatch: one per local expert of the receiver
};

inline constexpr uint32_t kFlagFp8 = 1, kFlagRoundScale = 2, kFlagUe8m0 = 4;

// The payload bytes an LL record needs at most (counts for kMaxLocalExperts experts).
uint64_t ll_record_payload_bytes();

// Writes `record` into a record slot's payload; returns its size. Throws proxyep::Error(phase)
// when it does not fit.
uint64_t encode_ll_record(const LlRecord& record, std::span<std::byte> slot,
                          std::string_view phase);
// Decodes the record rank `from` sent. Throws proxyep::Error(phase) naming `from` for a record
// of another format (e.g. a normal-mode call) or a malformed one.
LlRecord decode_ll_record(std::span<const std::byte> payload, int from, std::string_view phase);

}  // namespace proxyep::integrations::low_latency
