// Pure data structures and wire formats: region descriptors, address blobs, the slot pool, and
// what registration puts into a descriptor on each provider.
#include "fabric/context_pool.hpp"
#include "fabric/fabric.hpp"
#include "fabric/region_descriptor.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

RegionDescriptor sample_descriptor() {
  RegionDescriptor descriptor;
  descriptor.length = 1 << 20;
  descriptor.rails = {{0x7f0000001000ull, 0x11}, {0x7f0000001000ull, 0xffffffffffffffffull}};
  return descriptor;
}

}  // namespace

TEST_CASE("region descriptor round trip") {
  RegionDescriptor descriptor = sample_descriptor();
  RegionDescriptor back = RegionDescriptor::deserialize(descriptor.serialize());
  CHECK(back.length == descriptor.length);
  REQUIRE(back.rails.size() == 2);
  CHECK(back.rails[1].address == descriptor.rails[1].address);
  CHECK(back.rails[1].key == descriptor.rails[1].key);
}

TEST_CASE("region descriptor targets are bounds-checked") {
  RegionDescriptor descriptor = sample_descriptor();
  CHECK(descriptor.target(1, 16).address == 0x7f0000001010ull);
  CHECK(descriptor.target(1, 16).key == 0xffffffffffffffffull);
  CHECK(descriptor.target(0, descriptor.length).address == 0x7f0000001000ull + (1 << 20));
  CHECK_THROWS_AS(descriptor.target(0, descriptor.length + 1), Error);
  CHECK_THROWS_AS(descriptor.target(2, 0), Error);
  CHECK_THROWS_AS(descriptor.target(-1, 0), Error);
}

TEST_CASE("malformed region descriptors are rejected, never misread") {
  Bytes good = sample_descriptor().serialize();
  for (size_t cut = 0; cut < good.size(); ++cut) {
    CAPTURE(cut);
    CHECK_THROWS_AS(RegionDescriptor::deserialize(std::span(good.data(), cut)), Error);
  }
  Bytes trailing = good;
  trailing.push_back(0);
  CHECK_THROWS_AS(RegionDescriptor::deserialize(trailing), Error);
  Bytes magic = good;
  magic[0] ^= 0xff;
  CHECK_THROWS_AS(RegionDescriptor::deserialize(magic), Error);
  Bytes version = good;
  version[4] = 99;
  CHECK_THROWS_AS(RegionDescriptor::deserialize(version), Error);
  Bytes no_rails = good;
  no_rails[6] = 0;
  no_rails[7] = 0;
  CHECK_THROWS_AS(RegionDescriptor::deserialize(no_rails), Error);
  Bytes many_rails = good;
  many_rails[7] = 0xff;  // claims 65282 rails
  CHECK_THROWS_AS(RegionDescriptor::deserialize(many_rails), Error);
  try {
    RegionDescriptor::deserialize(std::span(good.data(), 10));
  } catch (const Error& error) {
    CHECK(error.phase() == "fabric.descriptor");
  }
  CHECK_THROWS_AS(RegionDescriptor{}.serialize(), Error);
}

TEST_CASE("slot pool: exhaustion, ownership, reuse") {
  struct Slot {
    int value = 0;
    double pad = 0;
  };
  SlotPool<Slot> pool(3);
  Slot* a = pool.acquire();
  Slot* b = pool.acquire();
  Slot* c = pool.acquire();
  REQUIRE((a && b && c));
  CHECK(pool.acquire() == nullptr);
  CHECK(pool.in_use() == 3);
  CHECK(pool.owns(b));
  CHECK_FALSE(pool.owns(reinterpret_cast<char*>(b) + 1));
  Slot outside;
  CHECK_FALSE(pool.owns(&outside));
  CHECK_FALSE(pool.owns(nullptr));
  pool.release(b);
  CHECK(pool.acquire() == b);
}

TEST_CASE("registration follows the provider's MR mode") {
  // shm (1.17): FI_MR_VIRT_ADDR, app keys. tcp;ofi_rxm: offsets, app keys.
  for (std::string provider : {"shm", "tcp"}) {
    CAPTURE(provider);
    auto fabric = Fabric::open(options_for(provider, 0, 2));
    std::vector<uint8_t> a(4096), b(4096);
    auto region_a = fabric->register_memory(a.data(), a.size());
    auto region_b = fabric->register_memory(b.data(), b.size());
    RegionDescriptor da = region_a->descriptor(), db = region_b->descriptor();
    REQUIRE(da.rails.size() == 2);
    CHECK(da.length == 4096);
    CHECK(region_a->size() == 4096);
    CHECK(region_a->data() == a.data());
    CHECK(region_a->kind() == MemoryKind::host);
    uint64_t base = fabric->capabilities().mr_virt_addr ? reinterpret_cast<uint64_t>(a.data()) : 0;
    CHECK(da.rails[0].address == base);
    CHECK(da.target(1, 10).address == base + 10);
    // Both rails share one domain (fake rails): every key in it must differ.
    std::set<uint64_t> keys{da.rails[0].key, da.rails[1].key, db.rails[0].key, db.rails[1].key};
    CHECK(keys.size() == 4);
    CHECK_THROWS_AS(region_a->local_desc(2), Error);
    CHECK_THROWS_AS(fabric->register_memory(nullptr, 10), Error);
    CHECK_THROWS_AS(fabric->register_memory(a.data(), 0), Error);
    // Host memory claimed as CUDA: no CUDA in this build, no FI_HMEM, or not device memory.
    CHECK_THROWS_AS(fabric->register_memory(a.data(), a.size(), MemoryKind::cuda), Error);
  }
  auto shm = Fabric::open(options_for("shm", 0));
  CHECK(shm->capabilities().mr_virt_addr);
  auto tcp = Fabric::open(options_for("tcp", 0));
  CHECK_FALSE(tcp->capabilities().mr_virt_addr);
}

TEST_CASE("address blobs: malformed, misordered or mismatched lists are refused") {
  auto one = Fabric::open(options_for("shm", 0, 1));
  auto two = Fabric::open(options_for("shm", 1, 2));
  Bytes mine = one->addresses();
  Bytes other = two->addresses();
  // Rail counts differ between the ranks.
  CHECK_THROWS_AS(one->connect({mine, other}), Error);
  // Our own entry is not where our rank says.
  CHECK_THROWS_AS(two->connect({mine, mine}), Error);
  // Truncated and garbage blobs of a peer.
  for (size_t cut : {size_t{0}, size_t{3}, size_t{8}, mine.size() - 1}) {
    CAPTURE(cut);
    auto peer = Fabric::open(options_for("shm", 0, 1));
    Bytes blob(mine.begin(), mine.begin() + static_cast<ptrdiff_t>(cut));
    CHECK_THROWS_AS(peer->connect({peer->addresses(), blob}), Error);
  }
  try {
    auto peer = Fabric::open(options_for("shm", 0, 1));
    peer->connect({peer->addresses(), Bytes{1, 2, 3, 4, 5, 6, 7, 8}});
    FAIL("garbage accepted");
  } catch (const Error& error) {
    CHECK(error.phase() == "fabric.connect");
  }
  CHECK_THROWS_AS(one->connect({}), Error);
}
