// DeepEP V2's expanded layout (do_expand; docs/plans/ELASTIC_BUFFER.md, section 3.1), on the
// host: one slot per (received token, local expert) instead of one row per received token.
// Expert e's slots start at the aligned end of expert e - 1's, in source order within it:
//   base[e] = align(psum[e - 1], A),  psum[e] = base[e] + count[e],  M = align(psum[last], A)
// (psum is the handle's psum_num_recv_tokens_per_expert in this layout). A dispatch first
// receives its rows as the non-expanded layout does, then copies each into its slots; a combine
// folds each token's slots back into one row (their sum in lane order, rounded to bf16: DeepEP's
// "multiple reduction") before the usual combine.
#pragma once

#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/backend/row_backend.hpp"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations::elastic {

using gpu_side::ep::Tensor;
using gpu_side::ep::TensorRef;

struct ExpandPlan {
  std::vector<int32_t> base, psum;  // [E_local], as above
  int64_t slots = 0;                // M
};

// The plan of `counts` (received (token, local expert) pairs per local expert) aligned to A.
ExpandPlan plan_expand(std::span<const int> counts, int alignment);

// Each received row's slot per lane into metadata columns 2.. (i32 [rows, K + 2], rows >=
// num_recv; -1 for lanes whose expert is elsewhere): from recv_topk_idx (i64 [rows, K], local
// ids), rows in receive order. Throws proxyep::Error when the rows name other numbers of pairs
// of an expert than `plan` counted (the notify phase's counts and the rows must agree).
void assign_slots(const ExpandPlan& plan, const TensorRef& recv_topk_idx, int64_t num_recv,
                  int32_t* metadata);

// A slot table (recv_src_metadata's columns 2..: the caller's to change, as DeepEP's) checked
// before any row is copied by it: i32 [>= num_recv, K + 2], host memory, every slot in
// [-1, slots). Throws proxyep::Error(phase).
void check_slot_columns(const TensorRef& metadata, int64_t num_recv, int64_t slots,
                        std::string_view phase);

// The copies that put rows (of `unit` bytes: a row of x, of scales, or one f32 weight per lane
// with `per_lane`) of the non-expanded `from` into their slots of `to`, by the metadata's slot
// columns: one run per taken slot, for RowBackend::copy_runs (host or device memory alike).
std::vector<gpu_side::ep::CopyRun> expand_runs(const std::byte* from, std::byte* to, uint64_t unit,
                                               bool per_lane, const int32_t* metadata,
                                               int64_t num_recv, int topk);

// Combine's fold: bf16 [num_recv, hidden] rows, row i the sum (float32, lanes in order, rounded
// once) of token i's slots of x_expanded (bf16 [>= M, hidden]); and, with weights (f32 [>= M]),
// f32 [num_recv, K] lane weights (0 where the lane has no slot). `rows` is the backend of the
// memory x_expanded and weights are in: it allocates the outputs there and does the work (the
// combine's reduce with the K lanes as its ranks, and copies); the metadata (i32 [>= num_recv,
// K + 2]) is host memory. Queued work: complete it before reading the outputs.
struct Folded {
  Tensor x, weights;
};

// The sums both expanded combines end with (fold_expanded, slot_combine.hpp): row t of x the
// biases (if any) and then lane k's row heads[t * K + k] of `rows_base` (bf16 [.., hidden]), in
// lane order, in float32, rounded once (-1: the lane adds nothing); with `weights_base` (f32, one
// per row of rows_base) f32 [tokens, K] lane weights, copied from the same rows (0 at -1). The
// combine's own reduce with the K lanes as its groups, on `rows`; heads are host memory.
Folded sum_lanes(RowBackend& rows, const uint16_t* rows_base, const float* weights_base,
                 std::span<const int32_t> heads, int64_t tokens, int topk, int64_t hidden,
                 const uint16_t* bias0 = nullptr, const uint16_t* bias1 = nullptr);

Folded fold_expanded(RowBackend& rows, const TensorRef& x_expanded, const TensorRef& weights,
                     const TensorRef& metadata, int64_t num_recv);

}  // namespace proxyep::integrations::elastic
