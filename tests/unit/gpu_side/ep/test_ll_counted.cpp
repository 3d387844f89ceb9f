// The counted unpack's CPU twin (gpu_side/ep/ll_counted.hpp) against the receive as the host
// protocol wrote it before (a row table built message by message: expert by expert, source by
// source, a running first message per source), on random counts with empty sources and experts,
// in both formats; counts no sink holds, negative ones and a source without a slot stay inside
// the sinks; bad sizes are refused. The way back (ll_return_counted) returns every row to the
// message it came from, and a layout past the blocks or the slot moves nothing past them.
#include "gpu_side/ep/ll_counted.hpp"

#include <doctest/doctest.h>

#include <algorithm>
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

// The way back: the unpack's rows (each filled with the src_info it got, i.e. its message's
// source * 1000 + index) returned by the layout_range the unpack wrote land in each source's slot
// at the index of the message they came from.
TEST_CASE("ll_return_counted: every row goes back to the message it came from") {
  std::mt19937_64 rng(20261206);
  const LlFormat f = format(false);
  for (int round = 0; round < 60; ++round) {
    const int32_t ranks = std::uniform_int_distribution<int32_t>(1, 6)(rng);
    const int32_t experts = std::uniform_int_distribution<int32_t>(1, 5)(rng);
    const int64_t tokens = std::uniform_int_distribution<int64_t>(1, 7)(rng);
    const int64_t rows = ranks * tokens;
    CAPTURE(round);
    std::vector<int32_t> counts(static_cast<size_t>(ranks * experts));
    for (auto& c : counts)
      c = rng() % 3 == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, tokens)(rng);
    std::vector<std::vector<std::byte>> slots;
    std::vector<const std::byte*> from;
    std::vector<int64_t> sent(static_cast<size_t>(ranks), 0);
    for (int32_t s = 0; s < ranks; ++s) {
      for (int32_t e = 0; e < experts; ++e)
        sent[static_cast<size_t>(s)] += counts[static_cast<size_t>(s * experts + e)];
      slots.push_back(random_slot(f, sent[static_cast<size_t>(s)], s, rng));
      from.push_back(slots.back().data());
    }
    Outputs got(f, experts, ranks, rows);
    ll_unpack_counted_on_host(params(f, counts, from, got, rows));
    std::vector<uint16_t> x(static_cast<size_t>(experts * rows) * f.hidden, 0xdead);
    for (int64_t r = 0; r < experts * rows; ++r)
      std::fill_n(x.begin() + r * f.hidden, f.hidden,
                  static_cast<uint16_t>(got.src_info[static_cast<size_t>(r)]));
    const int64_t slot_rows = tokens * experts;
    std::vector<std::vector<uint16_t>> back(static_cast<size_t>(ranks),
                                            std::vector<uint16_t>(slot_rows * f.hidden, 0xbeef));
    std::vector<uint16_t*> to;
    for (auto& b : back)
      to.push_back(b.data());
    const LlReturnCountedParams p{.layout_range = got.layout_range.data(),
                                  .x = x.data(),
                                  .to = to.data(),
                                  .ranks = ranks,
                                  .local_experts = experts,
                                  .rows_per_expert = rows,
                                  .slot_rows = slot_rows,
                                  .hidden = f.hidden};
    REQUIRE(ll_return_counted_error(p) == nullptr);
    ll_return_counted_on_host(p);
    for (int32_t s = 0; s < ranks; ++s)
      for (int64_t m = 0; m < slot_rows; ++m) {
        const uint16_t want = m < sent[static_cast<size_t>(s)] ? static_cast<uint16_t>(s * 1000 + m)
                                                               : uint16_t{0xbeef};
        const std::vector<uint16_t>& slot = back[static_cast<size_t>(s)];
        CHECK(std::all_of(slot.begin() + m * f.hidden, slot.begin() + (m + 1) * f.hidden,
                          [&](uint16_t v) { return v == want; }));
      }
  }
}

TEST_CASE("ll_return_counted: a layout past the blocks or the slot moves nothing past them") {
  // One expert of 2 rows, 1 source: the layout claims 5 rows from row 1, the slot holds 3 rows;
  // then a null slot.
  const uint32_t hidden = 8;
  std::vector<uint16_t> x(3 * hidden);  // a third row: what the clamp must not read
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<uint16_t>(i / hidden + 1);
  std::vector<uint16_t> slot(4 * hidden, 0);
  std::vector<int64_t> range{(int64_t{1} << 32) | 5};
  std::vector<uint16_t*> to{slot.data()};
  LlReturnCountedParams p{.layout_range = range.data(),
                          .x = x.data(),
                          .to = to.data(),
                          .ranks = 1,
                          .local_experts = 1,
                          .rows_per_expert = 2,
                          .slot_rows = 3,
                          .hidden = hidden};
  ll_return_counted_on_host(p);
  CHECK(std::all_of(slot.begin(), slot.begin() + hidden, [](uint16_t v) { return v == 2; }));
  CHECK(std::all_of(slot.begin() + hidden, slot.end(), [](uint16_t v) { return v == 0; }));
  to[0] = nullptr;
  ll_return_counted_on_host(p);  // nothing to write, nothing read
  LlReturnCountedParams bad = p;
  bad.hidden = 12;
  CHECK(ll_return_counted_error(bad) != nullptr);
  bad = p;
  bad.rows_per_expert = 0;
  CHECK(ll_return_counted_error(bad) != nullptr);
  bad = p;
  bad.slot_rows = -1;
  CHECK(ll_return_counted_error(bad) != nullptr);
  bad = p;
  bad.threads = 2048;
  CHECK(ll_return_counted_error(bad) != nullptr);
}

// A step's writes to other nodes: each sized by its group of counts (negative counts as 0),
// whole units that fit the room, a signal when empty; a negative group leaves a write alone.
TEST_CASE("ll_write_bytes: writes sized from their group's counts, empty ones become signals") {
  const std::vector<int32_t> counts = {3,  0, 2,   // group 0: 5 units
                                       0,  0, 0,   // group 1: nothing
                                       -4, 1, 0,   // group 2: 1 unit (a negative counts 0)
                                       9,  9, 9};  // group 3: 27 units, more than the room
  const std::vector<int32_t> groups = {0, 1, 2, 3, -1};
  std::vector<proxyep::gpu_side::Descriptor> writes(5);
  for (auto& w : writes) {
    w.op = proxyep::gpu_side::Op::signal;
    w.length = 0;
    w.imm = 77;
  }
  writes[4].op = proxyep::gpu_side::Op::write_imm;  // the fixed write: left as it is
  writes[4].length = 12;
  const SizeWritesParams p{.writes = writes.data(),
                           .counts = counts.data(),
                           .groups = groups.data(),
                           .group_size = 3,
                           .unit_bytes = 100,
                           .max_bytes = 2050,
                           .count = 5};
  REQUIRE(ll_write_bytes_error(p) == nullptr);
  ll_write_bytes_on_host(p);
  CHECK(writes[0].op == proxyep::gpu_side::Op::write_imm);
  CHECK(writes[0].length == 500);
  CHECK(writes[1].op == proxyep::gpu_side::Op::signal);
  CHECK(writes[1].length == 0);
  CHECK(writes[2].length == 100);
  CHECK(writes[3].length == 2000);  // 20 whole units fit 2050 bytes
  CHECK(writes[4].length == 12);
  CHECK(writes[4].op == proxyep::gpu_side::Op::write_imm);
  for (const auto& w : writes)
    CHECK(w.imm == 77);  // nothing but op and length changes

  SizeWritesParams bad = p;
  bad.unit_bytes = 0;
  CHECK(ll_write_bytes_error(bad) != nullptr);
  bad = p;
  bad.max_bytes = 99;
  CHECK(ll_write_bytes_error(bad) != nullptr);
  bad = p;
  bad.group_size = 0;
  CHECK(ll_write_bytes_error(bad) != nullptr);
  bad = p;
  bad.groups = nullptr;
  CHECK(ll_write_bytes_error(bad) != nullptr);
}
