// What low-latency calls of one shape need from the session, and the size hint DeepEP callers
// pass as num_rdma_bytes (DEEPEP_CONTRACT 3.4).
//
// LL calls travel in the session's eager slots (2 parities x R sources per rank, arena_layout.hpp):
// in call k, rank s's messages for rank d sit in d's eager slot [k % 2][s]. One slot holds the
// most either call can carry from one source:
//   dispatch  E_local x T messages (every token of the source to every local expert), of
//             16 + 2H bytes (BF16, the larger format; FP8 is 16 + H + H/32)
//   combine   E_local x T bf16 rows of 2H bytes going back
// so a Buffer needs 2 x R x slot bytes, which is the hint. Like DeepEP's it grows with T, H and
// E (E x T x 2H per parity), not with the number of nodes; ranks with peers on other nodes stage
// as much again for their writes.
#pragma once

#include "integrations/low_latency/ll_record.hpp"

#include <cstdint>
#include <string_view>

namespace proxyep::integrations::low_latency {

// One eager slot for `shape` in a group of `ranks` (a multiple of 64).
uint64_t ll_slot_bytes(const LlShape& shape, int ranks);
// num_rdma_bytes that hold LL calls of `shape`: 2 x ranks x ll_slot_bytes, a multiple of 128.
int64_t ll_size_hint(const LlShape& shape, int ranks);
// The eager slot a Buffer of `num_rdma_bytes` gives LL calls (0: none).
uint64_t ll_slot_from_rdma_bytes(int64_t num_rdma_bytes, int ranks);

// Throws proxyep::Error(phase) unless `shape` is usable by `ranks` ranks: T >= 1, hidden a
// positive multiple of 128, experts divisible by ranks with at most kMaxLocalExperts per rank.
void check_shape(const LlShape& shape, int ranks, std::string_view phase);

}  // namespace proxyep::integrations::low_latency
