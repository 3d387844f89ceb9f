#include "control/imm_layout.hpp"

#include <doctest/doctest.h>

#include <random>
#include <set>

namespace imm = proxyep::control::imm;

// Compile-time: the layout is usable in constant expressions and its limits are what the rest
// of the ordering layer assumes.
static_assert(imm::kMaxKeys == (uint64_t{1} << 28));
static_assert(imm::kMaxStreams == 4096);
static_assert(imm::kSeqModulus == 65536 && imm::kMaxWindow == 32768);
static_assert(imm::epoch_tag(0) == 0 && imm::epoch_tag(7) == 3 && imm::epoch_tag(1ull << 40) == 0);
static_assert(imm::decode(imm::encode_stream(1, 0, 0)).op() == imm::Op::stream);
static_assert(imm::decode(imm::encode_counter(2, 0)).raw == 0x80000000u);
static_assert(imm::encode_control(3, 0) == 0xf0000000u);
static_assert(imm::encode_credit(0, 1, 2) == ((2u << 28) | (1u << 16) | 2u));
static_assert(!imm::KeyField::fits(imm::kMaxKeys) && imm::KeyField::fits(imm::kMaxKeys - 1));
static_assert(!imm::StreamField::fits(4096) && imm::StreamField::fits(4095));

TEST_CASE("imm: random round trips of every op") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 100000; ++i) {
    uint64_t epoch = rng();
    auto key = static_cast<uint32_t>(rng() % imm::kMaxKeys);
    auto stream = static_cast<uint32_t>(rng() % imm::kMaxStreams);
    auto seq = static_cast<uint16_t>(rng());
    auto payload = static_cast<uint32_t>(rng() & imm::PayloadField::kMax);

    auto c = imm::decode(imm::encode_counter(epoch, key));
    REQUIRE(c.op() == imm::Op::counter);
    REQUIRE(c.epoch_tag() == (epoch & 3));
    REQUIRE(c.key() == key);

    auto s = imm::decode(imm::encode_stream(epoch, stream, seq));
    REQUIRE(s.op() == imm::Op::stream);
    REQUIRE(s.epoch_tag() == (epoch & 3));
    REQUIRE(s.stream() == stream);
    REQUIRE(s.seq() == seq);

    auto r = imm::decode(imm::encode_credit(epoch, stream, seq));
    REQUIRE(r.op() == imm::Op::credit);
    REQUIRE(r.stream() == stream);
    REQUIRE(r.seq() == seq);

    auto x = imm::decode(imm::encode_control(epoch, payload));
    REQUIRE(x.op() == imm::Op::control);
    REQUIRE(x.payload() == payload);
  }
}

TEST_CASE("imm: limits and exhaustive small fields") {
  for (uint32_t tag = 0; tag < imm::kEpochTags; ++tag)
    for (uint32_t op = 0; op < 4; ++op) {
      uint32_t raw = imm::encode(tag, static_cast<imm::Op>(op), imm::PayloadField::kMax);
      CHECK(imm::decode(raw).epoch_tag() == tag);
      CHECK(static_cast<uint32_t>(imm::decode(raw).op()) == op);
      CHECK(imm::decode(raw).payload() == imm::PayloadField::kMax);
    }
  // Every stream id and the extreme sequences survive, and distinct inputs give distinct imms.
  std::set<uint32_t> seen;
  for (uint32_t stream = 0; stream < imm::kMaxStreams; ++stream)
    for (uint16_t seq : {uint16_t{0}, uint16_t{1}, uint16_t{0x7fff}, uint16_t{0xffff}}) {
      uint32_t raw = imm::encode_stream(3, stream, seq);
      CHECK(imm::decode(raw).stream() == stream);
      CHECK(imm::decode(raw).seq() == seq);
      CHECK(seen.insert(raw).second);
    }
  CHECK(imm::decode(imm::encode_counter(0, imm::kMaxKeys - 1)).key() == imm::kMaxKeys - 1);
}

TEST_CASE("imm: oversized values never bleed into other fields") {
  // Out-of-range inputs are reduced to their field; op and epoch stay intact.
  uint32_t raw = imm::encode_counter(1, 0xffffffffu);
  CHECK(imm::decode(raw).op() == imm::Op::counter);
  CHECK(imm::decode(raw).epoch_tag() == 1);
  CHECK(imm::decode(raw).key() == imm::KeyField::kMax);
  raw = imm::encode_stream(2, 0xffffffu, 7);
  CHECK(imm::decode(raw).op() == imm::Op::stream);
  CHECK(imm::decode(raw).epoch_tag() == 2);
  CHECK(imm::decode(raw).stream() == imm::StreamField::kMax);
  CHECK(imm::decode(raw).seq() == 7);
  raw = imm::encode_control(0, 0xffffffffu);
  CHECK(imm::decode(raw).op() == imm::Op::control);
  CHECK(imm::decode(raw).epoch_tag() == 0);
}
