// The notify record's wire format: what one rank encodes another decodes, and anything else (a
// record of another version, a torn or truncated one, counts for another group size) fails
// loudly, naming the sender.
#include "integrations/normal/notify_record.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/ep_shape.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

using namespace proxyep;
namespace ep = proxyep::gpu_side::ep;
using namespace proxyep::integrations::normal;

namespace {

RecordHeader header() {
  RecordHeader h;
  h.kind = CallKind::dispatch;
  h.num_tokens = 4096;
  h.format = {.hidden_bytes = 14336, .scale_cols = 56, .topk = 8, .weights = 8, .src_index = 1};
  h.num_experts = 64;
  h.expert_alignment = 128;
  h.num_worst_tokens = 9000;
  h.landing.fitted = {.offset = uint64_t{5} << 32, .bytes = 8192};  // beyond 32 bits
  h.landing.largest = {.offset = 4096, .bytes = (uint64_t{3} << 33) + 4096};
  h.fabric_chunking = {.send_rows = 20, .recv_rows = 128};
  return h;
}

// A record written into a slot as large as a group of `ranks` gets, the rest left as garbage.
std::vector<std::byte> slot_with(const RecordEncoder& encoder, std::span<const int32_t> experts,
                                 int ranks) {
  std::vector<std::byte> slot(record_payload_bytes(ranks), std::byte{0xa5});
  CHECK(encoder.write(slot, experts, "test") <= slot.size());
  return slot;
}

}  // namespace

TEST_CASE("a record decodes to what was encoded, experts per destination") {
  const std::vector<int64_t> rows_to{3, 0, 17, 4096};
  const std::vector<int32_t> experts{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  RecordEncoder encoder;
  encoder.begin(header(), rows_to);
  for (size_t n : {size_t{16}, size_t{0}, size_t{5}}) {
    const auto slot = slot_with(encoder, std::span(experts).first(n), 4);
    const NotifyRecord r = decode_record(slot, 4, 2, "dispatch");
    CHECK(r.header.kind == CallKind::dispatch);
    CHECK(r.header.num_tokens == 4096);
    CHECK(r.header.format == header().format);
    CHECK(r.header.num_experts == 64);
    CHECK(r.header.expert_alignment == 128);
    CHECK(r.header.num_worst_tokens == 9000);
    CHECK(r.header.landing.fitted.offset == header().landing.fitted.offset);
    CHECK(r.header.landing.fitted.bytes == 8192);
    CHECK(r.header.landing.largest.offset == 4096);
    CHECK(r.header.landing.largest.bytes == header().landing.largest.bytes);
    CHECK(r.header.fabric_chunking == FabricChunking{.send_rows = 20, .recv_rows = 128});
    CHECK(r.rows_to == std::vector<int32_t>{3, 0, 17, 4096});
    CHECK(r.experts == std::vector<int32_t>(experts.begin(), experts.begin() + n));
  }
}

TEST_CASE("the largest record fits the slot size the group gets") {
  const int ranks = 8;
  std::vector<int64_t> rows_to(ranks, 1);
  std::vector<int32_t> experts(ep::kMaxLocalExperts, 7);
  RecordEncoder encoder;
  encoder.begin(header(), rows_to);
  std::vector<std::byte> slot(record_payload_bytes(ranks));
  CHECK(encoder.write(slot, experts, "test") <= slot.size());
  // One expert count more than the slot holds is refused, not written past its end.
  std::vector<std::byte> small(slot.size() - 1);
  CHECK_THROWS_AS((void)encoder.write(small, experts, "test"), Error);
}

TEST_CASE("a record of another version, kind or group size is refused naming the sender") {
  const std::vector<int64_t> rows_to{1, 2};
  RecordEncoder encoder;
  encoder.begin(header(), rows_to);
  auto expect_refused = [](std::vector<std::byte> slot, int ranks, const char* text) {
    CAPTURE(text);
    try {
      (void)decode_record(slot, ranks, 1, "combine");
      FAIL("decoded a bad record");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  auto slot = slot_with(encoder, {}, 2);
  slot[4] = std::byte{1};  // version 1 (before the landing offer)
  expect_refused(slot, 2, "version 1");
  slot = slot_with(encoder, {}, 2);
  slot[6] = std::byte{9};  // call kind 9
  expect_refused(slot, 2, "unknown call kind");
  expect_refused(slot_with(encoder, {}, 3), 3, "counts rows for 2 ranks");
  expect_refused(slot_with(encoder, {}, 2), 1, "claims 2 rows_to");
  // RDMA chunks of more rows than may be in flight, or a window without chunks.
  for (const FabricChunking bad : {FabricChunking{.send_rows = 8, .recv_rows = 4},
                                   FabricChunking{.send_rows = 0, .recv_rows = 4}}) {
    RecordHeader h = header();
    h.fabric_chunking = bad;
    RecordEncoder chunked;
    chunked.begin(h, rows_to);
    expect_refused(slot_with(chunked, {}, 2), 2, "chunks its streams to other nodes");
  }
  // Torn: the slot ends inside the record.
  std::vector<std::byte> whole(256);
  std::vector<std::byte> torn(encoder.write(whole, {}, "test") - 3);
  std::memcpy(torn.data(), whole.data(), torn.size());
  CHECK_THROWS_AS((void)decode_record(torn, 2, 1, "combine"), Error);
}
