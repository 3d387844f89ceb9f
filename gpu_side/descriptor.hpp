// The transfer descriptor: what a producer (a GPU kernel or its CPU twin) asks a proxy to do.
//
// One layout, one encode, one decode, shared by CUDA and host code (PROXYEP_HOST_DEVICE, from
// common/host_device.hpp).
// `Descriptor` is the logical view producers fill in; `WireDescriptor` is its fixed 64-byte
// image, exactly one ring slot and one cache line:
//
//   offset  size  field
//        0     8  seq            ring-owned sequence/valid word, written last (see ring.hpp)
//        8     1  version        kDescriptorVersion; a decoder rejects any other value
//        9     1  op             Op
//       10     2  flags          kFlag* bits; unknown bits are rejected
//       12     4  dst_rank       destination rank (32 bits: >= 1024 ranks)
//       16     4  local_region   id of the registered source region
//       20     4  remote_region  id of the destination region on dst_rank
//       24     8  src_offset     byte offset in the local region (64 bits: > 4 GiB)
//       32     8  dst_offset     byte offset in the remote region
//       40     8  length         bytes to write; 0 for Op::signal
//       48     8  cookie         producer's tag carried back in completions (stream, timestamp)
//       56     4  imm            32-bit immediate the write carries (EFA's budget)
//       60     4  check          hash of every other field, including seq
//
// Why 64 B and not NCCL GIN's 128 B: every field fits one line, so a slot is written and read as
// one cache line (one PCIe write burst from a GPU). The per-slot `seq` plays the role of GIN's
// per-qword valid bits: a consumer acts on a slot only after the producer's release store of seq,
// and the `check` word (covering seq too) catches what the protocol cannot, e.g. a GPU write
// that landed without its fence, a stale slot from an earlier lap, or memory corrupted by a bug.
#pragma once

#include "common/host_device.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace proxyep::gpu_side {

inline constexpr uint8_t kDescriptorVersion = 1;
inline constexpr size_t kDescriptorBytes = 64;

enum class Op : uint8_t {
  write_imm = 1,  // RMA write of `length` bytes carrying `imm` (the receiver's proof of arrival)
  signal = 2,     // zero-length write carrying only `imm` (counters, flags, acks)
  nop = 3,        // fills a reserved slot the producer ended up not needing; the proxy skips it
};
inline constexpr uint8_t kMaxOp = 3;

// The producer has more descriptors for this destination right behind this one: the proxy may
// post it with FI_MORE and ring the NIC's doorbell once for the batch.
inline constexpr uint16_t kFlagMore = 1u << 0;
inline constexpr uint16_t kKnownFlags = kFlagMore;

// Logical descriptor: what a producer fills in and a consumer gets back from decode().
struct Descriptor {
  Op op = Op::write_imm;
  uint16_t flags = 0;
  uint32_t dst_rank = 0;
  uint32_t local_region = 0;
  uint32_t remote_region = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  uint64_t cookie = 0;
  uint32_t imm = 0;
};

// The 64-byte wire image (layout in the table above).
struct alignas(kDescriptorBytes) WireDescriptor {
  uint64_t seq;
  uint8_t version;
  uint8_t op;
  uint16_t flags;
  uint32_t dst_rank;
  uint32_t local_region;
  uint32_t remote_region;
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
  uint64_t cookie;
  uint32_t imm;
  uint32_t check;
};

// The layout is an ABI between a GPU kernel, a CPU proxy and (through memfd) another process:
// any change must bump kDescriptorVersion, and these asserts make an accidental change fail to
// compile on every platform and under nvcc alike.
static_assert(sizeof(WireDescriptor) == kDescriptorBytes,
              "WireDescriptor must be exactly 64 bytes: one ring slot, one cache line");
static_assert(alignof(WireDescriptor) == kDescriptorBytes,
              "WireDescriptor must be cache-line aligned so slots never share a line");
static_assert(std::is_trivially_copyable_v<WireDescriptor>,
              "WireDescriptor is copied with memcpy/volatile word stores between GPU and host");
static_assert(std::is_standard_layout_v<WireDescriptor>,
              "offsetof on WireDescriptor needs a standard-layout type");
static_assert(offsetof(WireDescriptor, seq) == 0,
              "seq must be the first word: the payload is bytes 8..63, stored before seq");
static_assert(offsetof(WireDescriptor, version) == 8 && offsetof(WireDescriptor, op) == 9 &&
                  offsetof(WireDescriptor, flags) == 10,
              "header byte offsets changed: bump kDescriptorVersion and fix the layout table");
static_assert(offsetof(WireDescriptor, dst_rank) == 12 &&
                  offsetof(WireDescriptor, local_region) == 16 &&
                  offsetof(WireDescriptor, remote_region) == 20,
              "rank/region offsets changed: bump kDescriptorVersion and fix the layout table");
static_assert(offsetof(WireDescriptor, src_offset) == 24 &&
                  offsetof(WireDescriptor, dst_offset) == 32 &&
                  offsetof(WireDescriptor, length) == 40 && offsetof(WireDescriptor, cookie) == 48,
              "64-bit fields must stay 8-byte aligned at 24/32/40/48 (one store each)");
static_assert(offsetof(WireDescriptor, imm) == 56 && offsetof(WireDescriptor, check) == 60,
              "imm and check must share the last word, check last");
static_assert(sizeof(Op) == 1, "Op is stored in one byte");

// Result of decode(): like std::expected's error, never an exception on the hot path.
enum class [[nodiscard]] DecodeResult : uint8_t{
    ok,
    bad_version,  // written by a producer built against another descriptor version
    bad_op,       // unknown op
    bad_flags,    // unknown flag bits
    bad_length,   // signal with a payload, write with none, or an offset + length that wraps
    bad_check,    // check word mismatch: torn, stale or corrupted slot
};

// The check word over every field but itself. Each field word is mixed as (word + add) * mul with
// its own random constants (odd multipliers); the products are independent (no dependency chain,
// about ten cycles on a CPU) and summed. The high half of a 64-bit product depends on every bit
// of its input, so folding it into the low half gives 32 bits that change with any bit flip and
// with any mixture of two descriptors' words. Field words are packed arithmetically, so the
// value depends neither on byte order nor on how a compiler lays out the struct. (Constants are
// literals, not a constexpr array: nvcc lets device code read namespace-scope constexpr
// scalars only.)
PROXYEP_HOST_DEVICE constexpr uint64_t check_mix(uint64_t word, uint64_t add, uint64_t mul) {
  return (word + add) * mul;
}

PROXYEP_HOST_DEVICE constexpr uint32_t descriptor_check(const WireDescriptor& w) {
  const uint64_t header = uint64_t{w.version} | (uint64_t{w.op} << 8) | (uint64_t{w.flags} << 16) |
                          (uint64_t{w.dst_rank} << 32);
  const uint64_t regions = uint64_t{w.local_region} | (uint64_t{w.remote_region} << 32);
  const uint64_t h = check_mix(w.seq, 0x243f6a8885a308d3ull, 0x9e3779b97f4a7c15ull) +
                     check_mix(header, 0x13198a2e03707344ull, 0xc2b2ae3d27d4eb4full) +
                     check_mix(regions, 0xa4093822299f31d0ull, 0x165667b19e3779f9ull) +
                     check_mix(w.src_offset, 0x082efa98ec4e6c89ull, 0xd6e8feb86659fd93ull) +
                     check_mix(w.dst_offset, 0x452821e638d01377ull, 0xff51afd7ed558ccdull) +
                     check_mix(w.length, 0xbe5466cf34e90c6cull, 0xc4ceb9fe1a85ec53ull) +
                     check_mix(w.cookie, 0xc0ac29b7c97c50ddull, 0x94d049bb133111ebull) +
                     check_mix(uint64_t{w.imm}, 0x3f84d5b5b5470917ull, 0xbf58476d1ce4e5b9ull);
  return static_cast<uint32_t>(h >> 32) ^ static_cast<uint32_t>(h);
}

// Encodes `d` as the image a ring publishes under sequence word `seq` (the check covers seq, so
// a slot left over from an earlier lap never validates under the current one).
PROXYEP_HOST_DEVICE constexpr WireDescriptor encode(const Descriptor& d, uint64_t seq) {
  WireDescriptor w{};
  w.seq = seq;
  w.version = kDescriptorVersion;
  w.op = static_cast<uint8_t>(d.op);
  w.flags = d.flags;
  w.dst_rank = d.dst_rank;
  w.local_region = d.local_region;
  w.remote_region = d.remote_region;
  w.src_offset = d.src_offset;
  w.dst_offset = d.dst_offset;
  w.length = d.length;
  w.cookie = d.cookie;
  w.imm = d.imm;
  w.check = descriptor_check(w);
  return w;
}

// Validates `w` and, on DecodeResult::ok, fills `out`. `out` is untouched on failure.
PROXYEP_HOST_DEVICE constexpr DecodeResult decode(const WireDescriptor& w, Descriptor& out) {
  if (w.version != kDescriptorVersion) return DecodeResult::bad_version;
  if (w.check != descriptor_check(w)) return DecodeResult::bad_check;
  if (w.op == 0 || w.op > kMaxOp) return DecodeResult::bad_op;
  if ((w.flags & ~kKnownFlags) != 0) return DecodeResult::bad_flags;
  const Op op = static_cast<Op>(w.op);
  if (op == Op::signal && w.length != 0) return DecodeResult::bad_length;
  if (op == Op::write_imm && w.length == 0) return DecodeResult::bad_length;
  if (w.src_offset + w.length < w.src_offset || w.dst_offset + w.length < w.dst_offset)
    return DecodeResult::bad_length;
  out.op = op;
  out.flags = w.flags;
  out.dst_rank = w.dst_rank;
  out.local_region = w.local_region;
  out.remote_region = w.remote_region;
  out.src_offset = w.src_offset;
  out.dst_offset = w.dst_offset;
  out.length = w.length;
  out.cookie = w.cookie;
  out.imm = w.imm;
  return DecodeResult::ok;
}

// Host-side names for logs and errors ("bad_check").
const char* to_string(DecodeResult result);
const char* to_string(Op op);

}  // namespace proxyep::gpu_side
