// The reorder shim: EFA SRD semantics on shm and tcp. Payloads and immediates must survive
// segmentation and shuffling exactly once; order must actually change; a provider with 4 bytes
// of CQ data must be refused.
#include "fabric/domain.hpp"
#include "fabric/memory.hpp"
#include "fabric/provider.hpp"
#include "fabric/rail.hpp"
#include "fabric/reorder_shim.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

bool sorted(const std::vector<size_t>& order) {
  return std::is_sorted(order.begin(), order.end());
}

// Completions of rail `rail` (write i went to rail i % rails) delivered after a later write's:
// what the shim's Stats must count.
uint64_t late(const std::vector<size_t>& order, int rail, int rails) {
  uint64_t count = 0;
  bool any = false;
  size_t latest = 0;
  for (size_t i : order) {
    if (static_cast<int>(i % static_cast<size_t>(rails)) != rail) continue;
    if (any && i < latest)
      ++count;
    else
      latest = i, any = true;
  }
  return count;
}

}  // namespace

TEST_CASE("shim header round trip at the field limits") {
  ShimHeader header;
  header.source = ShimHeader::kMaxRanks - 1;
  header.sequence = ShimHeader::kSequenceWindow - 1;
  header.segments = ShimHeader::kMaxSegments;
  uint64_t data = header.encode(0xfedcba98u);
  CHECK(static_cast<uint32_t>(data) == 0xfedcba98u);
  ShimHeader back = ShimHeader::decode(data);
  CHECK(back.source == header.source);
  CHECK(back.sequence == header.sequence);
  CHECK(back.segments == header.segments);
  CHECK(back.key() == header.key());

  ShimHeader small{3, 17, 1};
  ShimHeader again = ShimHeader::decode(small.encode(0));
  CHECK(again.source == 3);
  CHECK(again.sequence == 17);
  CHECK(again.segments == 1);
  CHECK(again.key() != back.key());
}

TEST_CASE("reorder shim: every payload and immediate exactly once, in permuted order") {
  for (std::string provider : {"shm", "tcp"}) {
    for (int rails : {1, 2}) {
      CAPTURE(provider);
      CAPTURE(rails);
      FabricPair pair([&](int rank) { return options_for(provider, rank, rails, true, 7); },
                      4 * 1024 * 1024);
      ExchangeOrder order = exchange(pair, 300, 4 * 1024 * 1024, true);
      for (int r = 0; r < 2; ++r) {
        CHECK_FALSE(sorted(order.remote[r]));
        CHECK_FALSE(sorted(order.local[r]));
        uint64_t writes = 0, segments = 0;
        for (int rail = 0; rail < rails; ++rail) {
          auto& shim = dynamic_cast<ReorderShim&>(pair.fabric(r).rail(rail));
          const ReorderShim::Stats& stats = shim.stats();
          writes += stats.writes;
          segments += stats.segments;
          CHECK(stats.split_writes > 0);
          CHECK(stats.segments_out_of_order > 0);
          // The delivery-order counters say exactly what this rank saw.
          CHECK(stats.remote_out_of_order == late(order.remote[r], rail, rails));
          CHECK(stats.local_out_of_order == late(order.local[r], rail, rails));
          CHECK(stats.remote_out_of_order > 0);
          CHECK(stats.local_out_of_order > 0);
        }
        CHECK(writes == 300);
        CHECK(segments > writes);
      }
    }
  }
}

TEST_CASE("reorder shim with nothing held back, and with writes batched by `more`") {
  FabricPair pair(
      [&](int rank) {
        FabricOptions options = options_for("shm", rank, 1, true, 11);
        options.reorder.max_held = 0;
        options.reorder.segment_bytes = 100;
        return options;
      },
      64 * 1024);
  for (size_t i = 0; i < 64 * 1024; ++i)
    pair.rank(0).send[i] = pattern(0, i);
  // 16 writes of 1000 bytes posted as one burst: all but the last say more follow.
  RegionDescriptor target = pair.rank(1).recv_region->descriptor();
  Transport& rail = pair.fabric(0).rail(0);
  for (uint32_t i = 0; i < 16; ++i) {
    WriteOp op;
    op.peer = 1;
    op.local = pair.rank(0).send.data() + i * 1000;
    op.local_desc = pair.rank(0).send_region->local_desc(0);
    op.length = 1000;
    op.remote = target.target(0, i * 1000);
    op.imm = i;
    op.cookie = i;
    op.more = i != 15;
    auto deadline = Deadline::after_ms(kWaitMs);
    Status status;
    while ((status = rail.write(op)) == Status::again) {
      pair.poll_all();
      if (deadline.expired()) FAIL("write kept returning again");
    }
    REQUIRE(status == Status::ok);
  }
  pair.wait_until(
      [&] { return pair.rank(1).remote.size() == 16 && pair.rank(0).local.size() == 16; },
      "the burst");
  CHECK(std::equal(pair.rank(1).recv.begin(), pair.rank(1).recv.begin() + 16000,
                   pair.rank(0).send.begin()));
  CHECK(rail.writes_in_flight() == 0);
}

TEST_CASE("reorder shim presents EFA-like capabilities and logs a derived seed") {
  FabricPair pair([&](int rank) { return options_for("shm", rank, 1, true, 0); }, 4096);
  const Capabilities& caps = pair.fabric(0).capabilities();
  CHECK(caps.cq_data_size == 4);
  CHECK_FALSE(caps.rma_write_ordered);
  CHECK(caps.msg_order == 0);
  auto* shim = dynamic_cast<ReorderShim*>(&pair.fabric(0).rail(0));
  REQUIRE(shim != nullptr);
  CHECK(shim->seed() != 0);  // seed 0 asks for one derived from the clock and rank
  exchange(pair, 20, 4096);
}

TEST_CASE("a provider with 4 bytes of CQ data masks to them, and the shim refuses it") {
  // Pose as EFA: the shm entry with cq_data_size lowered to 4 before the domain opens.
  auto infos = query_infos(requests_for("shm").front());
  REQUIRE(!infos.empty());
  InfoPtr info = duplicate_info(*infos.front());
  info->domain_attr->cq_data_size = 4;
  auto domain = DomainContext::open(std::move(info));
  REQUIRE(domain->capabilities().cq_data_size == 4);

  auto rail = std::make_unique<Rail>(domain, RailOptions{});
  rail->connect({rail->address()});
  std::vector<uint8_t> buffer(64);
  auto region = register_region({rail.get()}, buffer.data(), buffer.size(), MemoryKind::host);
  WriteOp op;
  op.peer = 0;
  op.local = buffer.data();
  op.local_desc = region->local_desc(0);
  op.remote = region->descriptor().target(0, 0);
  auto deadline = Deadline::after_ms(kWaitMs);
  Status status;
  while ((status = rail->write_raw(op, 0x1234567800000009ull)) == Status::again)
    if (deadline.expired()) FAIL("write kept returning again");
  REQUIRE(status == Status::ok);
  std::vector<RawCompletion> seen;
  while (seen.size() < 2) {
    RawCompletion batch[4];
    size_t count = 0;
    REQUIRE(rail->poll_raw(batch, count) == Status::ok);
    seen.insert(seen.end(), batch, batch + count);
    if (deadline.expired()) FAIL("no completions");
  }
  auto remote = std::find_if(seen.begin(), seen.end(), [](const RawCompletion& c) {
    return c.kind == Completion::Kind::remote_write;
  });
  REQUIRE(remote != seen.end());
  CHECK(remote->data == 9);  // only the low 4 bytes travel
  region.reset();

  ReorderOptions reorder;
  reorder.enabled = true;
  try {
    ReorderShim shim(std::make_unique<Rail>(domain, RailOptions{}), reorder, 0);
    FAIL("the shim accepted 4 bytes of CQ data");
  } catch (const Error& error) {
    CHECK(error.phase() == "fabric.reorder");
    CHECK(error.message().find("needs 8") != std::string::npos);
  }
}
