// What the EP benchmarks check their outputs against, and the figures derived from the workload
// rather than from the run. Every rank (of `bench ep` and of the MPI baseline) regenerates every
// rank's inputs (deterministic, gpu_side/ep/workload.hpp), one at a time, and computes the
// straightforward reference of its own outputs (gpu_side/ep/reference.hpp); outputs must match
// it exactly.
//
// Combine input ("expert output"): each rank feeds back what it received, as BF16: recv_x itself
// for BF16 dispatch, recv_x cast back with its scales (bf16(float(e4m3) * scale)) for FP8. Then
// the combined row is (number of ranks the token went to) x x, the test invariant of DeepEP.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "gpu_side/ep/workload.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::tools {

// The BF16 combine input a rank derives from its dispatch output (see above). For BF16 the
// result shares recv_x's storage.
gpu_side::ep::Tensor expert_output(const gpu_side::ep::Tensor& recv_x,
                                   const gpu_side::ep::Tensor& recv_x_scales);

// Bytes of DeepEP's bandwidth conventions (DEEPEP_CONTRACT 4.1, 4.2), per rank, and the load.
struct EpTraffic {
  std::vector<int64_t> recv_rows;          // [R] rows (tokens) each rank receives, its own included
  std::vector<int64_t> node_pairs;         // [R] (token, destination node) pairs each rank sends
  std::vector<int64_t> tokens_per_expert;  // [E] (token, expert) pairs, summed over ranks
  std::vector<double> dispatch_bytes;      // [R] recv_rows * H * 2, FP8: * (1 + 4/128) / 2
  std::vector<double> combine_bytes;       // [R] recv_rows * H * 2 (combine is BF16)
  std::vector<double> rdma_dispatch_bytes;  // [R] node_pairs * H * 2 (FP8 factor as above)
  std::vector<double> rdma_combine_bytes;   // [R] node_pairs * H * 2
  // [R] the least that must cross the fabric: one row per (token, other node) it reaches
  // (node-deduplicated, the own node not counted), in dispatch's and combine's formats.
  std::vector<double> fabric_dispatch_bytes;
  std::vector<double> fabric_combine_bytes;
  double expert_imbalance = 0;  // max / mean of tokens_per_expert
  double rank_imbalance = 0;    // max / mean of recv_rows

  nlohmann::json to_json(int nodes) const;  // RDMA figures only when nodes > 1
};

// One rank's reference, built one source rank at a time: the inputs of the other ranks are
// regenerated (or read from `given`) one by one and dropped, so a rank holds its own inputs, its
// own reference dispatch and O(R x E) counts -- not every rank's inputs and dispatch, which at 128
// ranks was the largest allocation of the benchmark (R x T x H per rank).
class EpReference {
 public:
  // `given`: every rank's inputs, indexed by rank (`bench ll`'s DeepEP test data); empty:
  // regenerate them (gpu_side/ep/workload.hpp).
  EpReference(const gpu_side::ep::WorkloadOptions& options, int rank,
              std::span<const gpu_side::ep::RankInputs> given = {});

  const gpu_side::ep::WorkloadOptions& options() const { return options_; }
  int rank() const { return rank_; }
  // What the rank receives.
  const gpu_side::ep::ReferenceDispatch& dispatch() const { return dispatched_; }
  // The rank's combined output when every rank feeds expert_output(its dispatch): the rows that
  // come back are the rank's own tokens, so only its own inputs are needed. `order`: how the
  // run's combine summed (hierarchical internode: by node).
  gpu_side::ep::ReferenceCombine combine(
      gpu_side::ep::CombineOrder order = gpu_side::ep::CombineOrder::by_rank) const;
  // Every rank's figures (the same on every rank).
  const EpTraffic& traffic() const { return traffic_; }

 private:
  gpu_side::ep::WorkloadOptions options_;
  int rank_;
  gpu_side::ep::RankInputs own_;
  gpu_side::ep::ReferenceDispatch dispatched_;
  EpTraffic traffic_;
};

// A rank's dispatch outputs as views; undefined members are not compared.
struct DispatchOutputs {
  gpu_side::ep::TensorRef recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, recv_src_idx;
  const std::vector<int>* num_recv_tokens_per_expert = nullptr;
};

// Exact comparisons; each returns "" when equal, else the first difference in words
// ("recv_x: row 12 column 7 differs", "recv_topk_idx: shape [3, 8], expected [4, 8]").
std::string compare_tensor(const gpu_side::ep::TensorRef& got, const gpu_side::ep::TensorRef& want,
                           std::string_view name);
std::string compare_dispatch(const DispatchOutputs& got,
                             const gpu_side::ep::ReferenceDispatch& want);

}  // namespace proxyep::tools
