// ll_counted: where a low-latency dispatch's received messages go, from the per-expert counts
// its sources announced and nothing else (and, for the combine, where their rows go back), on the
// device (EpKernels::ll_unpack_counted) or on the host (ll_unpack_counted_on_host, the CPU
// twin). The receiving side of ll_route.hpp: a sender groups its messages to a rank by local expert
// (ll_routed_message), so the counts alone say where each message is in its slot and which row it
// becomes.
//
// The rule, for R sources, L local experts and counts c[s][e] = counts[s * L + e]:
//   - source s's messages for expert e start at message sum_{e' < e} c[s][e'] of its slot;
//   - they become rows begin(e, s) = sum_{s' < s} c[s'][e], ... of expert e's sink, in order:
//     an expert's rows are its sources' messages in rank order (DeepEP's layout);
//   - layout_range[e * R + s] = (begin(e, s) << 32) | c[s][e], recv_count[e] = sum_s c[s][e].
// Counts are the senders' word: a negative one counts as 0, rows at or past rows_per_expert are
// neither written nor counted, and a source whose slot is null sends nothing, so that the kernel
// stays inside the sinks whatever arrived (a caller refuses such counts before; the simulated
// device fails the stream on them).
#pragma once

#include "common/host_device.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ep/ll_rules.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// Where source s's messages for local expert e are and go.
struct LlCountedPlace {
  int64_t first_message = 0;  // in source s's slot
  int64_t first_row = 0;      // in expert e's sink
  int64_t count = 0;          // messages unpacked: c[s][e], but only the rows that fit the sink
};

PROXYEP_HOST_DEVICE inline int64_t ll_counted_count(const int32_t* counts, int32_t local_experts,
                                                    int32_t s, int32_t e) {
  const int32_t c = counts[static_cast<int64_t>(s) * local_experts + e];
  return c > 0 ? c : 0;
}

PROXYEP_HOST_DEVICE inline LlCountedPlace ll_counted_place(const LlUnpackCountedParams& p,
                                                           int32_t e, int32_t s) {
  LlCountedPlace place;
  for (int32_t j = 0; j < e; ++j)
    place.first_message += ll_counted_count(p.counts, p.local_experts, s, j);
  for (int32_t j = 0; j < s; ++j)
    place.first_row += ll_counted_count(p.counts, p.local_experts, j, e);
  const int64_t announced = ll_counted_count(p.counts, p.local_experts, s, e);
  const int64_t room = p.rows_per_expert - place.first_row;
  place.count = room <= 0 ? 0 : (announced < room ? announced : room);
  return place;
}

// Expert e's recv_count: its sources' messages, at most rows_per_expert.
PROXYEP_HOST_DEVICE inline int32_t ll_counted_rows(const LlUnpackCountedParams& p, int32_t e) {
  int64_t rows = 0;
  for (int32_t s = 0; s < p.ranks; ++s)
    rows += ll_counted_count(p.counts, p.local_experts, s, e);
  return static_cast<int32_t>(rows < p.rows_per_expert ? rows : p.rows_per_expert);
}

// layout_range's entry for (e, s): (first row << 32) | rows.
PROXYEP_HOST_DEVICE inline int64_t ll_counted_range(const LlCountedPlace& place) {
  return (place.first_row << 32) | place.count;
}

// Pair q = e * ranks + s (layout_range's index): its layout_range entry, expert e's recv_count
// when s is the last source, and the pair's messages into e's sink. Pairs own disjoint rows, so
// they run in any order, at once. Every lane of `lanes` calls it with the same arguments.
template <class Lanes>
PROXYEP_HOST_DEVICE inline void ll_unpack_counted_pair(const LlUnpackCountedParams& p, int64_t q,
                                                       const Lanes& lanes) {
  const auto e = static_cast<int32_t>(q / p.ranks), s = static_cast<int32_t>(q % p.ranks);
  const LlCountedPlace place = ll_counted_place(p, e, s);
  if (lanes.lane() == 0) {
    p.layout_range[q] = ll_counted_range(place);
    if (s == p.ranks - 1) p.recv_count[e] = ll_counted_rows(p, e);
  }
  const std::byte* from = p.from[s];
  const uint64_t message = p.format.message_bytes();
  for (int64_t i = 0; from != nullptr && i < place.count; ++i)
    ll_unpack_message(p.format, from + static_cast<uint64_t>(place.first_message + i) * message,
                      p.sinks[e], place.first_row + i, lanes);
}

// Whether `p`'s sizes are usable (pointers are the caller's to check): nullptr if so, else what
// is wrong.
const char* ll_unpack_counted_error(const LlUnpackCountedParams& p);

// The rule on the host, one pair after another.
void ll_unpack_counted_on_host(const LlUnpackCountedParams& p);

// ---- the way back: a combine's rows returned to their sources by the dispatch's layout ----
//
// Expert e's rows from source s (layout_range[e * R + s] = (first_row << 32) | count, what the
// counted unpack wrote) go back to s as the messages they came from: row first_row + i of e's
// block to row sum_{e' < e} count(e', s) + i of s's return slot, so the home rank finds them
// where ll_routed_row says, with no host reading the layout. The layout is clamped as the
// unpack's counts are (a negative or oversized entry moves nothing past the blocks or the slot).

PROXYEP_HOST_DEVICE inline int64_t ll_range_first(int64_t range) {
  return static_cast<int64_t>(static_cast<uint64_t>(range) >> 32);
}
PROXYEP_HOST_DEVICE inline int64_t ll_range_count(int64_t range) {
  return static_cast<int64_t>(static_cast<uint64_t>(range) & 0xffffffffu);
}

// Pair q = e * ranks + s: its rows into s's slot. Pairs write disjoint rows.
template <class Lanes>
PROXYEP_HOST_DEVICE inline void ll_return_counted_pair(const LlReturnCountedParams& p, int64_t q,
                                                       const Lanes& lanes) {
  const auto e = static_cast<int32_t>(q / p.ranks), s = static_cast<int32_t>(q % p.ranks);
  uint16_t* to = p.to[s];
  if (to == nullptr) return;
  int64_t first_message = 0;
  for (int32_t j = 0; j < e; ++j)
    first_message += ll_range_count(p.layout_range[static_cast<int64_t>(j) * p.ranks + s]);
  const int64_t range = p.layout_range[q];
  const int64_t first_row = ll_range_first(range);
  int64_t count = ll_range_count(range);
  if (first_row + count > p.rows_per_expert) count = p.rows_per_expert - first_row;
  if (first_message + count > p.slot_rows) count = p.slot_rows - first_message;
  const uint64_t row_bytes = 2ull * p.hidden;
  const auto* from = reinterpret_cast<const std::byte*>(p.x) +
                     (static_cast<uint64_t>(e) * static_cast<uint64_t>(p.rows_per_expert) +
                      static_cast<uint64_t>(first_row)) *
                         row_bytes;
  auto* into = reinterpret_cast<std::byte*>(to) + static_cast<uint64_t>(first_message) * row_bytes;
  for (int64_t i = 0; i < count; ++i)
    lanes.copy_bytes(into + static_cast<uint64_t>(i) * row_bytes,
                     from + static_cast<uint64_t>(i) * row_bytes, row_bytes);
}

// As ll_unpack_counted_error, for the way back.
const char* ll_return_counted_error(const LlReturnCountedParams& p);

// The rule on the host, one pair after another.
void ll_return_counted_on_host(const LlReturnCountedParams& p);

// Write i of a step (SizeWritesParams): its length from the counts of its group, whole units
// that fit max_bytes (negative counts as 0), and its op (a signal when it carries nothing).
PROXYEP_HOST_DEVICE inline void ll_write_bytes(const SizeWritesParams& p, int64_t i) {
  if (p.groups[i] < 0) return;
  const int32_t* group = p.counts + static_cast<int64_t>(p.groups[i]) * p.group_size;
  uint64_t units = 0;
  for (int32_t e = 0; e < p.group_size; ++e)
    units += group[e] > 0 ? static_cast<uint64_t>(group[e]) : 0;
  const uint64_t fit = p.max_bytes / p.unit_bytes;
  const uint64_t bytes = (units < fit ? units : fit) * p.unit_bytes;
  p.writes[i].op = bytes > 0 ? Op::write_imm : Op::signal;
  p.writes[i].length = bytes;
}

// Why SizeWritesParams cannot run, or null.
const char* ll_write_bytes_error(const SizeWritesParams& p);

// The rule on the host, one write after another.
void ll_write_bytes_on_host(const SizeWritesParams& p);

}  // namespace proxyep::gpu_side::ep
