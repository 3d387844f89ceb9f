// The arithmetic every EP component agrees on (host code, CPU twins, CUDA kernels): which rank
// owns an expert, which node a rank sits on, how wide a token row is. DeepEP's assumptions
// (DEEPEP_CONTRACT 1.4, 2.1): experts are laid out contiguously, rank r owns experts
// [r * E/R, (r+1) * E/R); ranks of a node are consecutive. DeepEP fixes 8 ranks per node;
// ProxyEP takes `ranks_per_node` as configuration so one machine can emulate several nodes.
#pragma once

#include "common/host_device.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// FP8 scales: one float32 per 128 channels of a token (DEEPEP_CONTRACT 2.7).
inline constexpr int kScaleBlock = 128;
// Token rows move in 16-byte units (DeepEP's int4 copies): hidden * element size must divide.
inline constexpr int kRowUnitBytes = 16;
// DeepEP's limits on top-k and on experts per rank.
inline constexpr int kMaxTopk = 32;
inline constexpr int kMaxLocalExperts = 1024;

struct EpShape {
  int num_ranks = 1;
  int ranks_per_node = 1;
  int num_experts = 1;

  PROXYEP_HOST_DEVICE constexpr int experts_per_rank() const { return num_experts / num_ranks; }
  PROXYEP_HOST_DEVICE constexpr int rank_of_expert(int64_t expert) const {
    return static_cast<int>(expert / experts_per_rank());
  }
  PROXYEP_HOST_DEVICE constexpr int num_nodes() const {
    return (num_ranks + ranks_per_node - 1) / ranks_per_node;
  }
  PROXYEP_HOST_DEVICE constexpr int node_of_rank(int rank) const { return rank / ranks_per_node; }
  PROXYEP_HOST_DEVICE constexpr bool same_node(int a, int b) const {
    return node_of_rank(a) == node_of_rank(b);
  }
  // `expert` as a local expert id on `rank`, or -1 when another rank owns it (or expert < 0).
  PROXYEP_HOST_DEVICE constexpr int64_t local_expert(int64_t expert, int rank) const {
    int64_t first = static_cast<int64_t>(rank) * experts_per_rank();
    return expert >= first && expert < first + experts_per_rank() ? expert - first : -1;
  }
};

}  // namespace proxyep::gpu_side::ep
