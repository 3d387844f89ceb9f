// The bootstrap's frame format and message helpers, without sockets.
#include "control/bootstrap_wire.hpp"
#include "control/star_endpoint.hpp"

#include <doctest/doctest.h>

#include <span>

using namespace proxyep::control;

TEST_CASE("wire: a frame round-trips through encode and decode") {
  wire::Header header{.kind = wire::Kind::contribute,
                      .op = wire::Op::broadcast,
                      .seq = 0x01020304,
                      .rank = 1023,
                      .aux = 7};
  wire::Bytes payload = {1, 2, 3, 250};
  auto frame = wire::encode_frame(header, payload);
  REQUIRE(frame.size() == wire::kHeaderBytes + payload.size());
  // Little-endian on the wire whatever the host: the magic spells "PXEB".
  CHECK(std::string(frame.begin(), frame.begin() + 4) == "PXEB");
  auto decoded = wire::decode_header(frame);
  CHECK(decoded.magic == wire::kMagic);
  CHECK(decoded.version == wire::kVersion);
  CHECK(decoded.kind == wire::Kind::contribute);
  CHECK(decoded.op == wire::Op::broadcast);
  CHECK(decoded.seq == 0x01020304u);
  CHECK(decoded.rank == 1023u);
  CHECK(decoded.aux == 7u);
  CHECK(decoded.length == 4u);
  CHECK(wire::Bytes(frame.begin() + wire::kHeaderBytes, frame.end()) == payload);
}

TEST_CASE("wire: strays and garbage are recognised") {
  wire::Bytes http(wire::kHeaderBytes, 'G');
  CHECK_THROWS_AS(wire::decode_header(http), wire::BadFrame);
  auto frame = wire::encode_frame(wire::Header{.kind = wire::Kind::hello}, {});
  frame[23] = 0xff;  // length's top byte: 4 GiB
  CHECK_THROWS_WITH_AS(wire::decode_header(frame), doctest::Contains("exceeds"), wire::BadFrame);
}

// Found by fuzz_bootstrap_wire (tests/fuzz): a header shorter than 24 bytes was read past its end.
TEST_CASE("wire: a header cut short is a BadFrame, never a read past its end") {
  const auto frame = wire::encode_frame(wire::Header{.kind = wire::Kind::hello}, {});
  for (size_t size = 0; size < wire::kHeaderBytes; ++size) {
    CAPTURE(size);
    CHECK_THROWS_WITH_AS(wire::decode_header(std::span(frame).first(size)),
                         doctest::Contains("truncated"), wire::BadFrame);
  }
}

TEST_CASE("wire: contributions and lists round-trip; truncation is caught") {
  wire::Bytes data = {9, 8, 7};
  auto contribution = wire::decode_contribution(wire::encode_contribution("phase x", data));
  CHECK(contribution.phase == "phase x");
  CHECK(contribution.data == data);

  std::vector<wire::Bytes> parts = {{}, {1}, {2, 3, 4}, {}};
  auto list = wire::encode_list(parts);
  CHECK(wire::decode_list(list) == parts);
  CHECK(wire::decode_list(wire::encode_list({})).empty());

  auto truncated = list;
  truncated.pop_back();
  CHECK_THROWS_AS(wire::decode_list(truncated), wire::BadFrame);
  auto padded = list;
  padded.push_back(0);
  CHECK_THROWS_AS(wire::decode_list(padded), wire::BadFrame);
  wire::Bytes huge_count = {0xff, 0xff, 0xff, 0x7f};
  CHECK_THROWS_AS(wire::decode_list(huge_count), wire::BadFrame);
  CHECK_THROWS_AS(wire::decode_contribution(wire::Bytes{5, 0, 0, 0, 'a'}), wire::BadFrame);
}

TEST_CASE("messages name ranks readably") {
  CHECK(ranks_text({2}) == "rank 2");
  CHECK(ranks_text({3, 2}) == "ranks 2, 3");
  CHECK(ranks_text({1, 2, 3, 4, 7, 9, 10}) == "ranks 1-4, 7, 9, 10");
}
