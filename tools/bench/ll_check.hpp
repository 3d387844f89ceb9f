// DeepEP's test_low_latency.py as data and checks (DEEPEP_CONTRACT 2.8, 4.3), for `proxyep bench
// ll` and its MPI baseline: the inputs, the byte and message counts of DeepEP's LL conventions, the
// expert output fed to combine, and the checks of dispatch and combine outputs.
//
// Inputs of rank r (make_ll_inputs): x bf16 [T, H] = r - 128 everywhere except the last 128
// channels, which hold the token index; topk_idx = the top-k (sorted, largest first) of
// |randn| + 1 scores over the experts, then 10 random (token, slot) entries set to -1; weights
// |randn|. Reproducible from the seed, so every rank regenerates every rank's inputs.
//
// Checks (LlReference): dispatch with the shared checker, gpu_side/ep/ll_reference.hpp's
// check_ll_dispatch (DeepEP's checks, exact: counts, source blocks tiling each expert's rows,
// src_info, payload and scales equal to DeepEP LL's cast of the token). Combine, with every
// expert's output being the dequantised dispatch row (ll_expert_output): equal to
// reference_ll_combine's bf16 output, and DeepEP's own test on top: calc_diff(combined,
// x * sum of the valid weights) below 1e-5 (BF16 dispatch) or 9e-4 (FP8), no NaN.
#pragma once

#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "gpu_side/ep/workload.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace proxyep::tools {

// Rank `rank`'s inputs (see above), x_fp8 / x_scales too when options.fp8 (normal mode moves
// pre-quantised rows; low-latency dispatch quantises x itself). Uses options' shape, num_tokens,
// hidden, topk, fp8 and seed.
gpu_side::ep::RankInputs make_ll_inputs(const gpu_side::ep::WorkloadOptions& options, int rank);

// DeepEP's LL byte conventions, per rank (what each rank sends): dispatch bytes per valid
// (token, expert) selection H + H/128*4 + 16 (FP8) or 2H + 16 (BF16); combine 2H. Messages: one
// per selection each way; "remote" ones go to experts on ranks of other nodes (through the proxy).
struct LlTraffic {
  std::vector<double> selections;                     // [R] valid (token, expert) selections
  std::vector<double> remote_selections;              // [R] of them to ranks on other nodes
  std::vector<double> dispatch_bytes, combine_bytes;  // [R]
  std::vector<double> remote_dispatch_bytes, remote_combine_bytes;  // [R]
  nlohmann::json to_json(int nodes) const;  // remote figures only when nodes > 1
};

// A rank's low-latency dispatch outputs as views (Buffer's, and the MPI baseline's).
using gpu_side::ep::LlDispatchOutputs;

// One row's expert output: bf16(float(e4m3 payload[c]) * scale of c's 128-channel group), the
// group's scale at scales[g * scale_stride]; BF16 rows are copied.
void ll_dequantise_row(const std::byte* payload, const float* scales, int64_t scale_stride,
                       int64_t hidden, bool fp8, uint16_t* out);

// Writes the expert output of `d` -- each valid row dequantised (FP8) or copied (BF16) as bf16 --
// into `out`, bf16 [E_local * R*T, H], allocated (zeroed) when it has not that form. Rows past an
// expert's recv_count are left as they are (combine reads none of them).
void ll_expert_output(const LlDispatchOutputs& d, int local_experts, gpu_side::ep::Tensor& out);

class LlReference {
 public:
  // Regenerates every rank's inputs (make_ll_inputs).
  explicit LlReference(const gpu_side::ep::WorkloadOptions& options);

  const std::vector<gpu_side::ep::RankInputs>& inputs() const { return inputs_; }
  const LlTraffic& traffic() const { return traffic_; }
  gpu_side::ep::LlFormat format() const;
  // "" when rank `rank`'s outputs pass the checks (above), else the first failure in words.
  std::string check_dispatch(int rank, const LlDispatchOutputs& d) const;
  // `diff` (optional) receives calc_diff's value.
  std::string check_combine(int rank, const gpu_side::ep::TensorRef& combined,
                            double* diff = nullptr) const;

 private:
  gpu_side::ep::WorkloadOptions options_;
  std::vector<gpu_side::ep::RankInputs> inputs_;
  std::vector<gpu_side::ep::LlRankInputs> views_;  // of inputs_, for the shared checker
  LlTraffic traffic_;
};

}  // namespace proxyep::tools
