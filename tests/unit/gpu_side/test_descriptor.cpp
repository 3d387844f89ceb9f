// The descriptor wire format: layout, round trips at the limits, and what decode rejects.
#include "gpu_side/descriptor.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <limits>

using namespace proxyep::gpu_side;
using proxyep::gpu_side::testing::make_descriptor;
using proxyep::gpu_side::testing::same;

namespace {

Descriptor max_descriptor() {
  Descriptor d;
  d.op = Op::write_imm;
  d.flags = kFlagMore;
  d.dst_rank = std::numeric_limits<uint32_t>::max();
  d.local_region = std::numeric_limits<uint32_t>::max();
  d.remote_region = std::numeric_limits<uint32_t>::max() - 1;
  d.src_offset = std::numeric_limits<uint64_t>::max() - 1;  // + length must not wrap
  d.dst_offset = (uint64_t{1} << 63);
  d.length = 1;
  d.cookie = std::numeric_limits<uint64_t>::max();
  d.imm = std::numeric_limits<uint32_t>::max();
  return d;
}

// Flips bit `bit` (0..511) of the 64-byte image.
WireDescriptor flip(WireDescriptor w, int bit) {
  unsigned char bytes[sizeof(w)];
  std::memcpy(bytes, &w, sizeof(w));
  bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  std::memcpy(&w, bytes, sizeof(w));
  return w;
}

}  // namespace

TEST_CASE("descriptor layout is one 64-byte cache line with fixed offsets") {
  // The static_asserts in descriptor.hpp already guard this at compile time; the test documents
  // the ABI and fails loudly if someone weakens the asserts.
  CHECK(sizeof(WireDescriptor) == 64);
  CHECK(alignof(WireDescriptor) == 64);
  CHECK(offsetof(WireDescriptor, seq) == 0);
  CHECK(offsetof(WireDescriptor, dst_rank) == 12);
  CHECK(offsetof(WireDescriptor, src_offset) == 24);
  CHECK(offsetof(WireDescriptor, length) == 40);
  CHECK(offsetof(WireDescriptor, cookie) == 48);
  CHECK(offsetof(WireDescriptor, imm) == 56);
  CHECK(offsetof(WireDescriptor, check) == 60);
  CHECK(std::is_trivially_copyable_v<WireDescriptor>);
}

TEST_CASE("encode/decode round trip, at the limits and for ordinary descriptors") {
  SUBCASE("max values: rank >= 1024, offsets > 4 GiB, all-ones cookie and immediate") {
    const Descriptor d = max_descriptor();
    const WireDescriptor w = encode(d, 0xfedcba9876543210ull);
    CHECK(w.version == kDescriptorVersion);
    CHECK(w.seq == 0xfedcba9876543210ull);
    Descriptor back;
    REQUIRE(decode(w, back) == DecodeResult::ok);
    CHECK(same(back, d));
    CHECK(back.dst_rank == 0xffffffffu);
    CHECK(back.src_offset > (uint64_t{4} << 30));
  }
  SUBCASE("signal: zero length") {
    Descriptor d = make_descriptor(3, 4);
    REQUIRE(d.op == Op::signal);
    Descriptor back;
    REQUIRE(decode(encode(d, 1), back) == DecodeResult::ok);
    CHECK(same(back, d));
    CHECK(back.length == 0);
  }
  SUBCASE("many descriptors under many sequence numbers") {
    for (uint64_t i = 0; i < 10000; ++i) {
      const Descriptor d = make_descriptor(static_cast<uint32_t>(i % 5), i);
      Descriptor back;
      REQUIRE(decode(encode(d, i * 977 + 1), back) == DecodeResult::ok);
      REQUIRE(same(back, d));
    }
  }
  SUBCASE("encode is usable in constant expressions (the same code nvcc compiles)") {
    constexpr WireDescriptor w = encode(Descriptor{.op = Op::signal, .dst_rank = 2048}, 7);
    static_assert(w.check == descriptor_check(w));
    static_assert(w.dst_rank == 2048 && w.length == 0);
  }
}

TEST_CASE("decode rejects a version mismatch") {
  WireDescriptor w = encode(make_descriptor(1, 2), 3);
  w.version = kDescriptorVersion + 1;
  w.check = descriptor_check(w);  // a consistent image from a newer producer
  Descriptor out = make_descriptor(9, 9);
  CHECK(decode(w, out) == DecodeResult::bad_version);
  CHECK(same(out, make_descriptor(9, 9)));  // untouched on failure
  w.version = 0;                            // a zeroed slot
  CHECK(decode(w, out) == DecodeResult::bad_version);
  CHECK(decode(WireDescriptor{}, out) == DecodeResult::bad_version);
}

TEST_CASE("decode rejects every single-bit corruption of the image") {
  const WireDescriptor good = encode(max_descriptor(), 12345);
  Descriptor out;
  for (int bit = 0; bit < 512; ++bit) {
    const DecodeResult result = decode(flip(good, bit), out);
    INFO("bit " << bit);
    CHECK(result != DecodeResult::ok);
  }
  WireDescriptor bad_check = good;
  bad_check.check ^= 0x80000000u;
  CHECK(decode(bad_check, out) == DecodeResult::bad_check);
}

TEST_CASE("decode rejects torn slots: any mixture of two descriptors' words") {
  // A torn slot holds some 8-byte words of one descriptor and the rest of another, e.g. a slot
  // of lap k+1 whose payload was only partly written over lap k's.
  const WireDescriptor old_image = encode(make_descriptor(0, 41), 41 + 1);
  const WireDescriptor new_image = encode(make_descriptor(0, 41 + 64), 41 + 64 + 1);
  uint64_t old_words[8], new_words[8];
  std::memcpy(old_words, &old_image, 64);
  std::memcpy(new_words, &new_image, 64);
  int rejected = 0, mixtures = 0;
  for (unsigned mask = 1; mask < 255; ++mask) {  // words taken from new_image
    uint64_t words[8];
    for (int i = 0; i < 8; ++i)
      words[i] = (mask >> i) & 1 ? new_words[i] : old_words[i];
    WireDescriptor torn;
    std::memcpy(&torn, words, 64);
    Descriptor out;
    ++mixtures;
    rejected += decode(torn, out) != DecodeResult::ok;
  }
  CHECK(rejected == mixtures);
  SUBCASE("a stale slot republished under a later seq does not validate") {
    WireDescriptor stale = old_image;
    stale.seq = old_image.seq + 64;  // next lap of a 64-slot ring
    Descriptor out;
    CHECK(decode(stale, out) == DecodeResult::bad_check);
  }
}

TEST_CASE("decode rejects unknown ops and flags and inconsistent lengths") {
  Descriptor out;
  auto reencoded = [](WireDescriptor w) {
    w.check = descriptor_check(w);  // consistent check: the field itself must be refused
    return w;
  };
  WireDescriptor w = encode(make_descriptor(0, 1), 1);
  w.op = 0;
  CHECK(decode(reencoded(w), out) == DecodeResult::bad_op);
  w.op = kMaxOp + 1;
  CHECK(decode(reencoded(w), out) == DecodeResult::bad_op);
  w = encode(make_descriptor(0, 1), 1);
  w.flags = 0x8000;
  CHECK(decode(reencoded(w), out) == DecodeResult::bad_flags);
  w = encode(Descriptor{.op = Op::signal, .length = 8}, 1);
  CHECK(decode(w, out) == DecodeResult::bad_length);
  w = encode(Descriptor{.op = Op::write_imm, .length = 0}, 1);
  CHECK(decode(w, out) == DecodeResult::bad_length);
  w = encode(Descriptor{.op = Op::write_imm, .dst_offset = ~uint64_t{0}, .length = 2}, 1);
  CHECK(decode(w, out) == DecodeResult::bad_length);
  w = encode(Descriptor{.op = Op::nop}, 1);
  CHECK(decode(w, out) == DecodeResult::ok);
  CHECK(std::string(to_string(DecodeResult::bad_check)) == "bad_check");
  CHECK(std::string(to_string(Op::signal)) == "signal");
}
