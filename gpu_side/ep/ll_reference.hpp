// The straightforward reference of low-latency (LL) dispatch and combine (DEEPEP_CONTRACT 2.7,
// 2.8, 4.3), which tests and `proxyep bench` compare the Buffer's LL outputs with. It is written
// apart from ll_rules.hpp (plain loops, double arithmetic rounded to float, frexp/ldexp, a
// nearest-value search for e4m3) so that a test compares two implementations, not one with
// itself:
// - ll_cast_reference: DeepEP LL dispatch's FP8 cast of one token (or the bf16 bytes).
// - check_ll_dispatch: DeepEP's checks of one rank's LL dispatch outputs, exact: per local
//   expert the received count, the per-source blocks tiling it, each block holding exactly the
//   source's tokens that chose the expert (in any order), src_info, and every row's payload and
//   scale words equal to ll_cast_reference of its token.
// - reference_ll_combine: a home rank's combined tokens from the experts' outputs.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace proxyep::gpu_side::ep {

// DeepEP LL's cast of the bf16 row `x` [f.hidden]. FP8: payload gets H e4m3 codes and
// scale_words f.scale_words() words (float32 scale_inv per 128 channels, or UE8M0 bytes packed
// four per word, group g in byte g % 4 of word g / 4). BF16: payload gets the row's 2H bytes and
// scale_words is not touched (may be null).
void ll_cast_reference(const LlFormat& f, const uint16_t* x, uint8_t* payload,
                       uint32_t* scale_words);

// One rank's LL inputs as views.
struct LlRankInputs {
  TensorRef x;             // bf16 [T_r, H], T_r <= num_max_dispatch_tokens_per_rank
  TensorRef topk_idx;      // i64 [T_r, K]: global expert ids, -1 = none
  TensorRef topk_weights;  // f32 [T_r, K] (combine only; may be undefined for dispatch checks)
};

// One rank's LL dispatch outputs as views (DeepEP's 3-D tensors flattened to 2-D).
struct LlDispatchOutputs {
  TensorRef recv_x;  // fp8 (or u8) / bf16 [E_local * R * T, H]: expert e's row i is row e*R*T + i
  // f32 or i32 [E_local * S, R * T] (S = format.scale_words()): expert e's word w of row i at
  // (e * S + w, i), i.e. column-major per expert; undefined for BF16.
  TensorRef recv_x_scales;
  TensorRef recv_count;    // i32 [E_local]
  TensorRef src_info;      // i32 [E_local, R * T]
  TensorRef layout_range;  // i64 [E_local, R]: (begin << 32) | count per source rank
};

// "" when `out` is what `rank` must receive from `all` (every rank's inputs, indexed by rank),
// with `max_tokens` = num_max_dispatch_tokens_per_rank; else the first discrepancy found,
// naming the local expert, source rank and row. Malformed views are reported the same way.
std::string check_ll_dispatch(std::span<const LlRankInputs> all, const EpShape& shape,
                              int64_t max_tokens, const LlFormat& format, int rank,
                              const LlDispatchOutputs& out);

// The output row (bf16 [hidden]) of global expert `expert` for token `token` of `home_rank`, or
// null to skip it (a masked rank).
using LlExpertRow = std::function<const uint16_t*(int64_t expert, int home_rank, int64_t token)>;

// out[t] = bf16( sum over k ascending with topk_idx[t][k] >= 0 and a row of
// topk_weights[t][k] * float(row[c]) ), in float32 from 0, each product rounded to float before
// it is added, rounded to bf16 once: bf16 [T, hidden]. topk_idx i64 [T, K], topk_weights f32
// [T, K].
Tensor reference_ll_combine(const TensorRef& topk_idx, const TensorRef& topk_weights,
                            uint32_t hidden, int home_rank, const LlExpertRow& expert_row);

}  // namespace proxyep::gpu_side::ep
