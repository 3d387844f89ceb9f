// RegionTable: descriptor fields become a WriteOp only when every id, rank, offset and length is
// valid; otherwise an error that names the descriptor and the peer, and nothing is filled.
#include "proxy/engine/region_table.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::fabric::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Setup {
  std::unique_ptr<fabric::Fabric> fabric = fabric::Fabric::open(options_for("shm", 0, 2));
  std::vector<uint8_t> buffer = std::vector<uint8_t>(4096);
  std::unique_ptr<fabric::MemoryRegion> region =
      fabric->register_memory(buffer.data(), buffer.size());
  fabric::RegionDescriptor remote{1000, {{0x10000, 5}, {0x20000, 6}}};
  RegionTable table{2, 2};
  Setup() {
    table.add_local(3, *region);
    table.add_remote(1, 7, remote);
  }
};

WriteRequest request(uint64_t src, uint64_t dst, uint64_t length) {
  return {.dst = 1,
          .local_region = 3,
          .remote_region = 7,
          .src_offset = src,
          .dst_offset = dst,
          .length = length,
          .cookie = 0xabc,
          .op = "write"};
}

}  // namespace

TEST_CASE("a valid descriptor becomes a write on the rail asked for") {
  Setup s;
  fabric::WriteOp op;
  std::string why;
  REQUIRE(s.table.translate(request(100, 200, 300), 1, op, why) == Status::ok);
  CHECK(op.peer == 1);
  CHECK(op.local == s.buffer.data() + 100);
  CHECK(op.local_desc == s.region->local_desc(1));
  CHECK(op.length == 300);
  CHECK(op.remote.address == 0x20000 + 200);
  CHECK(op.remote.key == 6);
  // The edges: a write that ends exactly at both regions' ends, and a zero-length one there.
  CHECK(s.table.translate(request(3096, 0, 1000), 0, op, why) == Status::ok);
  CHECK(s.table.translate(request(4096, 1000, 0), 0, op, why) == Status::ok);
}

TEST_CASE("invalid descriptors are refused with a message naming descriptor and peer") {
  Setup s;
  struct Case {
    WriteRequest request;
    int rail;
    const char* expect;
  };
  auto bad_dst = request(0, 0, 1);
  bad_dst.dst = 5;
  auto bad_local = request(0, 0, 1);
  bad_local.local_region = 4;
  auto bad_remote = request(0, 0, 1);
  bad_remote.remote_region = 70000;
  auto no_peer_region = request(0, 0, 1);
  no_peer_region.dst = 0;
  const Case cases[] = {
      {bad_dst, 0, "no such rank"},
      {request(0, 0, 1), 2, "no rail 2"},
      {bad_local, 0, "unknown local region 4"},
      {bad_remote, 0, "rank 1 registered no region 70000"},
      {no_peer_region, 0, "rank 0 registered no region 7"},
      {request(4000, 0, 97), 0, "leaves local region 3"},
      {request(0, 999, 2), 0, "leaves region 7 of rank 1"},
      {request(~0ull - 5, 0, 10), 0, "leaves local region"},  // offset + length overflows
      {request(0, 8, ~0ull), 0, "leaves"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expect);
    fabric::WriteOp op;
    std::string why;
    CHECK(s.table.translate(c.request, c.rail, op, why) == Status::error);
    CHECK(contains(why, c.expect));
    CHECK(contains(why, "cookie 0xabc"));
    CHECK(op.local == nullptr);  // nothing filled
  }
}

TEST_CASE("region registration errors are setup errors") {
  Setup s;
  CHECK_THROWS_AS(s.table.add_local(3, *s.region), Error);     // duplicate
  CHECK_THROWS_AS(s.table.add_remote(2, 1, s.remote), Error);  // no rank 2
  CHECK_THROWS_AS(s.table.add_local(RegionTable::kMaxRegionId, *s.region), Error);
  fabric::RegionDescriptor one_rail{100, {{0, 1}}};
  CHECK_THROWS_AS(s.table.add_remote(1, 8, one_rail), Error);  // needs 2 rails
  s.table.freeze();
  CHECK_THROWS_AS(s.table.add_remote(1, 9, s.remote), Error);  // too late
}

TEST_CASE("the address-space region takes a source's address as its offset, without a descriptor") {
  Setup s;
  s.table.add_local_address_space(9);
  std::vector<uint8_t> caller(64);
  auto from_caller = request(reinterpret_cast<uintptr_t>(caller.data()) + 8, 200, 32);
  from_caller.local_region = 9;
  fabric::WriteOp op;
  std::string why;
  REQUIRE(s.table.translate(from_caller, 1, op, why) == Status::ok);
  CHECK(op.local == caller.data() + 8);
  CHECK(op.local_desc == nullptr);  // a provider with FI_MR_LOCAL refuses it (Rail::post)
  CHECK(op.remote.address == 0x20000 + 200);
  // The target is still checked, and the source cannot wrap around the address space.
  auto too_far = from_caller;
  too_far.dst_offset = 990;
  CHECK(s.table.translate(too_far, 0, op, why) == Status::error);
  CHECK(contains(why, "leaves region 7 of rank 1"));
  auto wraps = from_caller;
  wraps.src_offset = ~0ull - 8;
  CHECK(s.table.translate(wraps, 0, op, why) == Status::error);
  CHECK(contains(why, "leaves local region 9"));
  CHECK_THROWS_AS(s.table.add_local_address_space(9), Error);  // duplicate
  CHECK_THROWS_AS(s.table.add_local_address_space(3), Error);  // taken by a registered region
}
