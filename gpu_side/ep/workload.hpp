// Synthetic MoE inputs, reproducible from a seed: the same options give every process (tests,
// `proxyep bench ep`, the MPI baseline program) the same tokens and routing for a rank, so each
// rank generates its own inputs and any process can regenerate any rank's to check results.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::ep {

enum class Routing : uint8_t {
  random,     // top-k of random scores: roughly uniform expert load
  skewed,     // scores biased towards low expert ids (Zipf-like): hot experts and hot ranks
  one_expert  // every token picks expert 0 only (other slots -1): everything to rank 0
};
Routing parse_routing(std::string_view name);  // "random" | "skewed" | "one-expert"; throws
std::string_view routing_name(Routing routing);

struct WorkloadOptions {
  EpShape shape;
  int num_tokens = 128;              // per rank, unless tokens_per_rank is given
  std::vector<int> tokens_per_rank;  // optional override, one entry per rank (0 allowed)
  int hidden = 7168;
  int topk = 8;
  Routing routing = Routing::random;
  double drop_fraction = 0.0;  // share of top-k entries replaced by -1 (no selection)
  bool fp8 = false;            // also produce x_fp8 + x_scales (per-128-channel, amax/448)
  // With fp8 (ignored otherwise): power-of-two scales packed as UE8M0 bytes, x_scales i32
  // [N, hidden / 512] (see cast_to_fp8_ue8m0); hidden must be a multiple of 512.
  bool ue8m0 = false;
  uint64_t seed = 1;

  int tokens_of(int rank) const;
};

struct RankInputs {
  Tensor x;             // bf16 [N, hidden]
  Tensor x_fp8;         // fp8_e4m3 [N, hidden] (when options.fp8)
  Tensor x_scales;      // f32 [N, hidden / 128], or i32 [N, hidden / 512] with ue8m0 (fp8)
  Tensor topk_idx;      // i64 [N, topk], -1 = no selection; distinct experts per row
  Tensor topk_weights;  // f32 [N, topk]
};

// Throws proxyep::Error("workload") for inconsistent options (experts not divisible by ranks,
// topk > experts, hidden not a multiple of 128 with fp8 or of 512 with fp8 + ue8m0, ...), so a
// program can check them before it starts any rank.
void check_workload(const WorkloadOptions& options);

// Checks the options (check_workload) and the rank, then generates the rank's inputs.
RankInputs make_rank_inputs(const WorkloadOptions& options, int rank);

// The same in parts, for a checker that needs only some rows of a rank's x: its routing
// (topk_idx, topk_weights; x undefined) -- cheap -- then rows `rows` of x, each row of x being a
// stream of its own (x is allocated zeroed when undefined; with options.fp8, x_fp8 and x_scales
// are recast from all of x, so only the listed rows of those are meaningful).
RankInputs make_rank_routing(const WorkloadOptions& options, int rank);
void make_x_rows(const WorkloadOptions& options, int rank, std::span<const int64_t> rows,
                 RankInputs& in);

// Per-token FP8 cast the way DeepEP's tests do it: per 128 channels, amax clamped to 1e-4,
// value * 448 / amax cast to e4m3, scale = amax / 448.
void cast_to_fp8(const Tensor& x_bf16, Tensor& x_fp8, Tensor& scales);

// Channels covered by one int32 of packed UE8M0 scales: four 128-channel groups.
inline constexpr int kUe8m0PackBlock = 4 * kScaleBlock;

// The UE8M0 form of the cast (DEEPEP_CONTRACT 2.7; DeepEP's LL `round_scale` + `use_ue8m0`
// arithmetic): per 128 channels, amax clamped to 1e-4, the scale is rounded up to a power of two,
// 2^ceil(log2(amax * (1/448))), and the payload is value / scale cast to e4m3. The scale is stored
// as its biased exponent byte (exponent + 127, the float32 exponent field); int32 j of a row holds
// groups 4j..4j+3 in its bytes 0..3 in memory order (little-endian). `packed_scales` becomes
// i32 [rows, hidden / 512]; hidden must be a multiple of 512. Tensors of the right form are
// reused, like cast_to_fp8.
void cast_to_fp8_ue8m0(const Tensor& x_bf16, Tensor& x_fp8, Tensor& packed_scales);

}  // namespace proxyep::gpu_side::ep
