// The 32-bit immediate of every ProxyEP data write (EFA's cq_data_size is 4 bytes, so this is
// the whole budget even on providers that carry 8). One layout, shared by CUDA kernels and host
// code, checked at compile time:
//
//   bit 31      30 29    28 27                                                       0
//      [ epoch:2  | op:2   | payload:28                                                ]
//   op = counter:          [ key:28                                                    ]
//   op = stream / credit:  [ stream:12               | sequence:16                     ]
//   op = control:          [ payload:28: the signal word counted (signal_words.hpp), or  ]
//                          [ a meaning agreed with the router's control handler          ]
//
// - epoch: the low 2 bits of the sender's epoch (iteration/phase number). The receiver keeps 4
//   counter banks, one per tag, and accepts tags of epochs e-1, e and e+1 around its current
//   epoch e (control/counter_bank.hpp), so late and early writes never count toward the wrong
//   iteration.
// - counter: a receiver counter key (2^28 keys: e.g. source rank x expert x channel).
// - stream: chunk `sequence` of stream `stream` landed (control/sequence_window.hpp); a stream is
//   one source rank per channel, so 4096 streams cover 1024 ranks x 4 channels.
// - credit: the receiver of stream `stream` has consumed every chunk before `sequence` (its tail),
//   sent back to the stream's sender (SenderCredits).
// Sequence numbers are 16 bits and wrap; windows are at most 2^15 so the wrap is unambiguous.
//
// Encoders reduce each value to its field width (values never bleed into neighbouring fields);
// callers check ranges at setup with Field::fits() or the kMax* constants.
#pragma once

#include "common/host_device.hpp"

#include <cstdint>

namespace proxyep::control::imm {

// One bit field of the immediate: `kWidth` bits starting at bit `kShift`. Static members only,
// so device code uses it without odr-using any host object.
template <uint32_t Shift, uint32_t Width>
struct Field {
  static_assert(Width >= 1 && Width < 32 && Shift + Width <= 32,
                "a field must lie inside the 32-bit imm (and leave room for others)");
  static constexpr uint32_t kShift = Shift;
  static constexpr uint32_t kWidth = Width;
  static constexpr uint32_t kMax = (1u << Width) - 1u;
  static constexpr uint64_t kCapacity = uint64_t{1} << Width;
  static constexpr uint32_t kMask = kMax << Shift;

  PROXYEP_HOST_DEVICE static constexpr uint32_t get(uint32_t imm) { return (imm >> Shift) & kMax; }
  PROXYEP_HOST_DEVICE static constexpr uint32_t put(uint64_t value) {
    return (static_cast<uint32_t>(value) & kMax) << Shift;
  }
  PROXYEP_HOST_DEVICE static constexpr bool fits(uint64_t value) { return value <= kMax; }
};

using EpochField = Field<30, 2>;
using OpField = Field<28, 2>;
using PayloadField = Field<0, 28>;
using KeyField = Field<0, 28>;      // op = counter
using StreamField = Field<16, 12>;  // op = stream, credit
using SeqField = Field<0, 16>;      // op = stream (sequence), credit (tail)

enum class Op : uint32_t { counter = 0, stream = 1, credit = 2, control = 3 };

inline constexpr uint32_t kEpochTags = static_cast<uint32_t>(EpochField::kCapacity);
inline constexpr uint64_t kMaxKeys = KeyField::kCapacity;
inline constexpr uint32_t kMaxStreams = static_cast<uint32_t>(StreamField::kCapacity);
inline constexpr uint32_t kSeqModulus = static_cast<uint32_t>(SeqField::kCapacity);
inline constexpr uint32_t kMaxWindow = kSeqModulus / 2;  // larger windows make the wrap ambiguous

static_assert(EpochField::kWidth + OpField::kWidth + PayloadField::kWidth == 32,
              "epoch, op and payload must fill exactly the 32-bit immediate (EFA's CQ data)");
static_assert((EpochField::kMask | OpField::kMask | PayloadField::kMask) == 0xffffffffu &&
                  (EpochField::kMask & OpField::kMask) == 0 &&
                  (OpField::kMask & PayloadField::kMask) == 0 &&
                  (EpochField::kMask & PayloadField::kMask) == 0,
              "epoch, op and payload must not overlap");
static_assert(KeyField::kMask == PayloadField::kMask, "a counter key is the whole payload");
static_assert((StreamField::kMask | SeqField::kMask) == PayloadField::kMask &&
                  (StreamField::kMask & SeqField::kMask) == 0,
              "stream id and sequence must split the payload exactly");
static_assert(OpField::kCapacity == 4, "four ops: counter, stream, credit, control");
static_assert(kEpochTags == 4, "counter banks are sized for 4 epoch tags (e-1, e, e+1, draining)");
static_assert(kMaxStreams >= 1024, "one stream per source rank: aim for at least 1024 ranks");
static_assert(SeqField::kWidth == 16, "sequences travel as uint16_t");

// The tag of an absolute epoch: its low bits.
PROXYEP_HOST_DEVICE constexpr uint32_t epoch_tag(uint64_t epoch) {
  return static_cast<uint32_t>(epoch) & EpochField::kMax;
}

PROXYEP_HOST_DEVICE constexpr uint32_t encode(uint64_t epoch, Op op, uint32_t payload) {
  return EpochField::put(epoch) | OpField::put(static_cast<uint32_t>(op)) |
         PayloadField::put(payload);
}
PROXYEP_HOST_DEVICE constexpr uint32_t encode_counter(uint64_t epoch, uint32_t key) {
  return encode(epoch, Op::counter, KeyField::put(key));
}
PROXYEP_HOST_DEVICE constexpr uint32_t encode_stream(uint64_t epoch, uint32_t stream,
                                                     uint16_t seq) {
  return encode(epoch, Op::stream, StreamField::put(stream) | SeqField::put(seq));
}
PROXYEP_HOST_DEVICE constexpr uint32_t encode_credit(uint64_t epoch, uint32_t stream,
                                                     uint16_t tail) {
  return encode(epoch, Op::credit, StreamField::put(stream) | SeqField::put(tail));
}
PROXYEP_HOST_DEVICE constexpr uint32_t encode_control(uint64_t epoch, uint32_t payload) {
  return encode(epoch, Op::control, payload);
}

// A decoded immediate; the payload accessors that apply depend on op().
struct Decoded {
  uint32_t raw = 0;

  PROXYEP_HOST_DEVICE constexpr uint32_t epoch_tag() const { return EpochField::get(raw); }
  PROXYEP_HOST_DEVICE constexpr Op op() const { return static_cast<Op>(OpField::get(raw)); }
  PROXYEP_HOST_DEVICE constexpr uint32_t payload() const { return PayloadField::get(raw); }
  PROXYEP_HOST_DEVICE constexpr uint32_t key() const { return KeyField::get(raw); }
  PROXYEP_HOST_DEVICE constexpr uint32_t stream() const { return StreamField::get(raw); }
  PROXYEP_HOST_DEVICE constexpr uint16_t seq() const {
    return static_cast<uint16_t>(SeqField::get(raw));
  }
};

PROXYEP_HOST_DEVICE constexpr Decoded decode(uint32_t imm) {
  return Decoded{imm};
}

// Round trips and limits, checked wherever this header is compiled (host and device).
static_assert(decode(encode_counter(5, 0x0abcdefu)).epoch_tag() == 1);
static_assert(decode(encode_counter(5, 0x0abcdefu)).op() == Op::counter);
static_assert(decode(encode_counter(5, 0x0abcdefu)).key() == 0x0abcdefu);
static_assert(decode(encode_counter(3, kMaxKeys - 1)).key() == kMaxKeys - 1);
static_assert(decode(encode_stream(2, kMaxStreams - 1, 0xffff)).stream() == kMaxStreams - 1);
static_assert(decode(encode_stream(2, kMaxStreams - 1, 0xffff)).seq() == 0xffff);
static_assert(decode(encode_credit(7, 1023, 17)).op() == Op::credit);
static_assert(decode(encode_credit(7, 1023, 17)).epoch_tag() == 3);
static_assert(decode(encode_control(0, 0x0fffffffu)).payload() == 0x0fffffffu);
static_assert(encode_counter(0, static_cast<uint32_t>(kMaxKeys)) == encode_counter(0, 0),
              "an oversized key is reduced to its field, never spilling into op or epoch");

}  // namespace proxyep::control::imm
