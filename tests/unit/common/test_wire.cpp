// common/wire.hpp: little-endian packing, bounds-checked reading, and the fixed-span writer.
#include "common/error.hpp"
#include "common/wire.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

using namespace proxyep;

TEST_CASE("wire: fields round trip in little-endian order") {
  std::vector<uint8_t> blob = {0xee};  // appending keeps what was there
  ByteWriter writer(blob);
  writer.u8(0x12);
  writer.u16(0x3456);
  writer.u32(0x789abcde);
  writer.u64(0x0123456789abcdefULL);
  const std::vector<uint8_t> payload = {1, 2, 3};
  writer.bytes(payload);
  CHECK(writer.written() == 1 + 2 + 4 + 8 + 3);
  REQUIRE(blob.size() == 1 + writer.written());
  // Byte order is fixed, whatever the host's.
  CHECK(blob[1] == 0x12);
  CHECK(blob[2] == 0x56);
  CHECK(blob[3] == 0x34);
  CHECK(blob[4] == 0xde);
  CHECK(blob[7] == 0x78);
  CHECK(blob[8] == 0xef);
  CHECK(blob[15] == 0x01);

  ByteReader reader(std::span<const uint8_t>(blob).subspan(1), "test.wire");
  CHECK(reader.u8("a") == 0x12);
  CHECK(reader.u16("b") == 0x3456);
  CHECK(reader.u32("c") == 0x789abcde);
  CHECK(reader.u64("d") == 0x0123456789abcdefULL);
  CHECK(reader.remaining() == 3);
  auto bytes = reader.bytes(3, "payload");
  CHECK(std::vector<uint8_t>(bytes.begin(), bytes.end()) == payload);
  CHECK(reader.remaining() == 0);
  CHECK_NOTHROW(reader.expect_end("blob"));
}

TEST_CASE("wire: a truncated blob throws naming the phase and the field") {
  std::vector<uint8_t> blob;
  ByteWriter writer(blob);
  writer.u32(7);
  writer.u16(9);
  blob.pop_back();  // the u16 lost a byte
  ByteReader reader(blob, "test.truncated");
  CHECK(reader.u32("count") == 7);
  CHECK_THROWS_WITH_AS(reader.u16("length"),
                       "test.truncated: malformed blob: length needs 2 bytes at offset 4, only 1 "
                       "left",
                       Error);
  ByteReader bytes_reader(blob, "test.truncated");
  CHECK_THROWS_WITH_AS(bytes_reader.bytes(6, "name"), doctest::Contains("name needs 6 bytes"),
                       Error);
}

TEST_CASE("wire: trailing bytes are rejected") {
  std::vector<uint8_t> blob;
  ByteWriter writer(blob);
  writer.u32(1);
  writer.u8(0);
  ByteReader reader(blob, "test.trailing");
  CHECK(reader.u32("value") == 1);
  CHECK_THROWS_WITH_AS(reader.expect_end("record"),
                       "test.trailing: record: 1 unexpected trailing bytes", Error);
}

TEST_CASE("wire: the fixed-span writer fills a caller's buffer and refuses to overflow it") {
  std::array<std::byte, 14> record{};
  ByteWriter writer(std::span<std::byte>(record), "test.record");
  writer.u64(0x1122334455667788ULL);
  writer.u32(0xa1b2c3d4);
  CHECK(writer.written() == 12);
  CHECK(record[0] == std::byte{0x88});
  CHECK(record[11] == std::byte{0xa1});
  // 4 bytes do not fit in the 2 left: it throws naming the phase, and writes nothing.
  CHECK_THROWS_WITH_AS(
      writer.u32(0xffffffff),
      "test.record: record overflow: 4 bytes at offset 12 do not fit the 14-byte buffer", Error);
  CHECK(record[12] == std::byte{0});
  CHECK(record[13] == std::byte{0});
  CHECK(writer.written() == 12);
  const std::array<uint8_t, 3> three = {1, 2, 3};
  CHECK_THROWS_AS(writer.bytes(three), Error);
  CHECK(record[12] == std::byte{0});
  writer.u16(0xbeef);  // exactly fills it
  CHECK(writer.written() == record.size());
  CHECK_THROWS_AS(writer.u8(0), Error);
  CHECK_NOTHROW(writer.bytes(std::span<const uint8_t>()));  // nothing still fits

  ByteReader reader(std::span<const std::byte>(record), "test.record");
  CHECK(reader.u64("a") == 0x1122334455667788ULL);
  CHECK(reader.u32("b") == 0xa1b2c3d4);
  CHECK(reader.u16("c") == 0xbeef);
  CHECK_NOTHROW(reader.expect_end("record"));

  std::array<uint8_t, 4> small{};
  ByteWriter small_writer(std::span<uint8_t>(small), "test.small");
  CHECK_THROWS_WITH_AS(small_writer.u64(1), doctest::Contains("test.small: record overflow"),
                       Error);
}

TEST_CASE("wire: int32 arrays are u32 fields, two's complement, little endian") {
  const std::vector<int32_t> values = {0, 1, -1, 0x12345678, INT32_MIN};
  std::vector<uint8_t> blob;
  ByteWriter writer(blob);
  writer.i32s(values);
  REQUIRE(blob.size() == 4 * values.size());
  CHECK(blob[4] == 0x01);  // 1: low byte first
  CHECK(blob[8] == 0xff);  // -1: every bit set
  CHECK(blob[12] == 0x78);
  CHECK(blob[15] == 0x12);
  ByteReader same(blob, "test.wire");
  CHECK(same.u32("one by one") == 0);
  CHECK(same.u32("one by one") == 1);
  ByteReader reader(blob, "test.wire");
  std::vector<int32_t> back(values.size());
  reader.i32s(back, "values");
  CHECK(back == values);
  ByteReader short_reader(std::span<const uint8_t>(blob).first(7), "test.wire");
  std::vector<int32_t> two(2);
  CHECK_THROWS_AS(short_reader.i32s(two, "values"), Error);
}
