// DeepEP V2's EPHandle fields (docs/plans/ELASTIC_BUFFER.md, section 1.7) for the non-expanded
// layout, from what a normal-mode dispatch already knows: its per-source row counts, its send
// heads and its received rows. Host arithmetic over host memory, one pass each, so that
// ElasticBuffer's dispatch costs what V1's does plus microseconds (the plan's 5% target).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace proxyep::integrations::elastic {

// i32 [num_scaleup_ranks]: inclusive prefix sum over scale-up peers of the rows received from
// the source ranks congruent to each (source % num_scaleup_ranks); the last entry is every row
// received. `received_from_each`: rows from each source rank.
std::vector<int32_t> psum_per_scaleup_rank(std::span<const int64_t> received_from_each,
                                           int num_scaleup_ranks);

// i32 [E_local]: the non-expanded layout's psum_num_recv_tokens_per_expert, the inclusive prefix
// sum of the counts rounded up to `alignment`.
std::vector<int32_t> aligned_psum(std::span<const int> unaligned, int alignment);

// What send_slots and source_metadata read: one dispatch's routing on this rank.
struct Routing {
  int ranks = 0, local_experts = 0, topk = 0;
};

// dst_buffer_slot_idx, i32 [tokens, topk] into `out`: lane k's row among the rows sent to the
// rank owning its expert (that rank's send head), or -1 for a -1 lane and for a rank an earlier
// lane of the token already named (the row travels once per rank). topk_idx: i64 [tokens, topk];
// send_head: i32 [tokens, ranks].
void send_slots(const Routing& routing, const int64_t* topk_idx, const int32_t* send_head,
                int64_t tokens, int32_t* out);

// recv_src_metadata, i32 [rows, topk + 2] into `out`, rows >= num_recv: for received row i,
// column 0 its global source id `src_rank * num_max_tokens_per_rank + src_token`, column 1
// `src_rank * topk + its first local lane` (DeepEP's is internal: a stable stand-in); the
// expanded layout's columns 2.. are -1 here, as are the rows past the received ones (worst-case
// outputs). Rows arrive grouped by source rank in rank order, `received_from_each` of each.
// recv_src_idx: i32 [num_recv]; recv_topk_idx: i64 [num_recv, topk] (local ids, -1 elsewhere).
void source_metadata(const Routing& routing, std::span<const int64_t> received_from_each,
                     const int32_t* recv_src_idx, const int64_t* recv_topk_idx,
                     int64_t num_max_tokens_per_rank, int64_t rows, int32_t* out);

}  // namespace proxyep::integrations::elastic
