// The counted unpack's CPU twin (gpu_side/ep/ll_counted.hpp) against the receive as the host
// protocol wrote it before (a row table built message by message: expert by expert, source by
// source, a running first message per source), on random counts with empty sources and experts,
// in both formats; counts no sink holds, negative ones and a source without a slot stay inside
// the sinks; bad sizes are refused.
#include "gpu_side/ep/ll_counted.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace proxyep::gpu_side::ep;

namespace {

// One receiver's outputs: every expert's rows in one array each, as the Buffer allocates them.
struct Outputs {
  Outputs(const LlFormat& f, int32_t experts, int32_t ranks, int64_t rows)
      : x(static_cast<size_t>(experts * rows) * f.payload_bytes(), std::byte{0xee}),
        scales(static_cast<size_t>(experts * rows) * f.scale_words(), 0xeeeeeeeeu),
        src_info(static_cast<size_t>(experts * rows), -7),
        recv_count(static_cast<size_t>(experts), -7),
        layout_range(static_cast<size_t>(experts * ranks), -7) {
    for (int32_t e = 0; e < experts; ++e)
      sinks.push_back(
          {.x = x.data() + static_cast<uint64_t>(e * rows) * f.payload_bytes(),
           .scales = f.scale_words() > 0
                         ? scales.data() + static_cast<uint64_t>(e * rows) * f.scale_words()
                         : nullptr,
           .scale_stride = rows,
           .src_info = src_info.data() + e * rows});
  }
  std::vector<std::byte> x;
  std::vector<uint32_t> scales;
  std::vector<int32_t> src_info, recv_count;
  std::vector<int64_t> layout_range;
  std::vector<LlExpertSink> sinks;
};

// Source s's slot: random messages whose headers carry s * 1000 + their index.
std::vector<std::byte> random_slot(const LlFormat& f, int64_t messages, int32_t s,
                                   std::mt19937_64& rng) {
  std::vector<std::byte> slot(static_cast<size_t>(messages) * f.message_bytes());
  for (auto& b : slot)
    b = static_cast<std::byte>(rng());
  for (int64_t m = 0; m < messages; ++m) {
    const int32_t token = s * 1000 + static_cast<int32_t>(m);
    std::memcpy(slot.data() + m * f.message_bytes(), &token, 4);
  }
  return slot;
}

// The receive as a row table built message by message.
void unpack_by_table(const LlFormat& f, const std::vector<int32_t>& counts,
                     const std::vector<const std::byte*>& from, int32_t experts, Outputs& out) {
  const auto ranks = static_cast<int32_t>(from.size());
  std::vector<int64_t> first(static_cast<size_t>(ranks), 0);
  for (int32_t e = 0; e < experts; ++e) {
    int64_t begin = 0;
    for (int32_t s = 0; s < ranks; ++s) {
      const int32_t count = counts[static_cast<size_t>(s * experts + e)];
      out.layout_range[static_cast<size_t>(e * ranks + s)] = (begin << 32) | count;
      for (int32_t i = 0; i < count; ++i)
        ll_unpack_message(f, from[s] + (first[s] + i) * f.message_bytes(), out.sinks[e], begin + i,
                          HostLanes{});
      first[s] += count;
      begin += count;
    }
    out.recv_count[static_cast<size_t>(e)] = static_cast<int32_t>(begin);
  }
}

LlUnpackCountedParams params(const LlFormat& f, const std::vector<int32_t>& counts,
                             const std::vector<const std::byte*>& from, Outputs& out,
                             int64_t rows) {
  return {.format = f,
          .counts = counts.data(),
          .from = from.data(),
          .sinks = out.sinks.data(),
          .recv_count = out.recv_count.data(),
          .layout_range = out.layout_range.data(),
          .ranks = static_cast<int32_t>(from.size()),
          .local_experts = static_cast<int32_t>(out.sinks.size()),
          .rows_per_expert = rows};
}

LlFormat format(bool fp8) {
  LlFormat f;
  f.hidden = fp8 ? 512 : 128;
  f.fp8 = fp8;
  return f;
}

}  // namespace

TEST_CASE("ll_unpack_counted: every message lands where the row table puts it") {
  std::mt19937_64 rng(20261205);
  for (int round = 0; round < 80; ++round) {
    const LlFormat f = format(round % 2 == 1);
    const int32_t ranks = std::uniform_int_distribution<int32_t>(1, 6)(rng);
    const int32_t experts = std::uniform_int_distribution<int32_t>(1, 5)(rng);
    const int64_t tokens = std::uniform_int_distribution<int64_t>(1, 7)(rng);
    const int64_t rows = ranks * tokens;
    CAPTURE(round);
    CAPTURE(ranks);
    CAPTURE(experts);
    // Empty sources and experts come up often; a source sends each expert at most `tokens`.
    std::vector<int32_t> counts(static_cast<size_t>(ranks * experts));
    for (auto& c : counts)
      c = rng() % 3 == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, tokens)(rng);
    std::vector<std::vector<std::byte>> slots;
    std::vector<const std::byte*> from;
    for (int32_t s = 0; s < ranks; ++s) {
      int64_t messages = 0;
      for (int32_t e = 0; e < experts; ++e)
        messages += counts[static_cast<size_t>(s * experts + e)];
      slots.push_back(random_slot(f, messages, s, rng));
      from.push_back(messages > 0 ? slots.back().data() : nullptr);
    }
    Outputs got(f, experts, ranks, rows), want(f, experts, ranks, rows);
    ll_unpack_counted_on_host(params(f, counts, from, got, rows));
    unpack_by_table(f, counts, from, experts, want);
    CHECK(got.x == want.x);
    CHECK(got.scales == want.scales);
    CHECK(got.src_info == want.src_info);
    CHECK(got.recv_count == want.recv_count);
    CHECK(got.layout_range == want.layout_range);
  }
}

TEST_CASE("ll_unpack_counted: counts no sink holds stay inside the sinks") {
  const LlFormat f = format(false);
  std::mt19937_64 rng(7);
  // 2 sources, 1 expert of 3 rows: source 0 announces 2, source 1 announces 4 (2 fit), then a
  // negative count and a source with messages but no slot.
  const std::vector<std::byte> slot0 = random_slot(f, 2, 0, rng), slot1 = random_slot(f, 4, 1, rng);
  Outputs out(f, 1, 2, 3);
  ll_unpack_counted_on_host(params(f, {2, 4}, {slot0.data(), slot1.data()}, out, 3));
  CHECK(out.recv_count[0] == 3);
  CHECK(out.layout_range == std::vector<int64_t>{2, (int64_t{2} << 32) | 1});
  CHECK(out.src_info == std::vector<int32_t>{0, 1, 1000});

  Outputs negative(f, 1, 2, 3);
  ll_unpack_counted_on_host(params(f, {-5, 1}, {slot0.data(), slot1.data()}, negative, 3));
  CHECK(negative.recv_count[0] == 1);
  CHECK(negative.src_info == std::vector<int32_t>{1000, -7, -7});

  Outputs no_slot(f, 1, 2, 3);
  ll_unpack_counted_on_host(params(f, {1, 1}, {nullptr, slot1.data()}, no_slot, 3));
  CHECK(no_slot.src_info == std::vector<int32_t>{-7, 1000, -7});
}

TEST_CASE("ll_unpack_counted: sizes a kernel cannot take are refused") {
  std::vector<int32_t> counts{0};
  std::vector<const std::byte*> from{nullptr};
  Outputs out(format(false), 1, 1, 1);
  LlUnpackCountedParams p = params(format(false), counts, from, out, 1);
  CHECK(ll_unpack_counted_error(p) == nullptr);
  LlUnpackCountedParams bad = p;
  bad.ranks = 0;
  CHECK(ll_unpack_counted_error(bad) != nullptr);
  bad = p;
  bad.local_experts = 1025;
  CHECK(ll_unpack_counted_error(bad) != nullptr);
  bad = p;
  bad.rows_per_expert = -1;
  CHECK(ll_unpack_counted_error(bad) != nullptr);
  bad = p;
  bad.threads = 48;
  CHECK(ll_unpack_counted_error(bad) != nullptr);
  bad = p;
  bad.format.hidden = 100;
  CHECK(ll_unpack_counted_error(bad) != nullptr);
}
