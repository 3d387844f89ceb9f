// What the low-latency Buffer tests with ranks as threads share (test_low_latency_threads.cpp,
// device_ll_case.hpp): two ranks of two experts each, the workload of a seed, the expert outputs
// a combine sends back, and exact checks of dispatch and combine against
// gpu_side/ep/ll_reference.hpp.
#pragma once

#include "common/error.hpp"
#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace proxyep::integrations::testing::ll {

namespace ep = gpu_side::ep;

inline constexpr int kRanks = 2;
inline constexpr int kTokens = 16;
inline constexpr int kHidden = 512;
inline constexpr int kLocal = 2;  // experts per rank

inline std::vector<ep::RankInputs> inputs(uint64_t seed) {
  ep::WorkloadOptions w;
  w.shape = {kRanks, 1, kLocal * kRanks};
  w.num_tokens = kTokens;
  w.hidden = kHidden;
  w.topk = 2;
  w.drop_fraction = 0.1;
  w.seed = seed;
  std::vector<ep::RankInputs> all;
  for (int r = 0; r < kRanks; ++r)
    all.push_back(ep::make_rank_inputs(w, r));
  return all;
}

inline uint16_t expert_value(int64_t expert, int home, int64_t token, int64_t c) {
  return ep::float_to_bf16(static_cast<float>((expert * 5 + home * 3 + token + c) % 17) / 8.0f);
}

// `recv_x`, `recv_x_scales` and `recv_count`: `d`'s, or host copies of them.
inline void check_dispatch(const LowLatencyDispatchResult& d, const ep::TensorRef& recv_x,
                           const ep::TensorRef& recv_x_scales, const ep::TensorRef& recv_count,
                           const std::vector<ep::RankInputs>& all, int me) {
  std::vector<ep::LlRankInputs> views;
  for (const auto& r : all)
    views.push_back({r.x, r.topk_idx, r.topk_weights});
  const std::string error = ep::check_ll_dispatch(
      views, {kRanks, 1, kLocal * kRanks}, kTokens, {.hidden = kHidden, .fp8 = true}, me,
      {recv_x, recv_x_scales, recv_count, d.handle.src_info, d.handle.layout_range});
  require(error.empty(), "test", "dispatch: {}", error);
}

inline void check_dispatch(const LowLatencyDispatchResult& d,
                           const std::vector<ep::RankInputs>& all, int me) {
  check_dispatch(d, d.recv_x, d.recv_x_scales, d.recv_count, all, me);
}

// The expert outputs for `d`'s received rows.
inline ep::Tensor expert_outputs(const LowLatencyDispatchResult& d, int me) {
  const int64_t rows = int64_t{kRanks} * kTokens;
  ep::Tensor x = ep::Tensor::zeros(ep::DType::bf16, kLocal * rows, kHidden);
  for (int e = 0; e < kLocal; ++e)
    for (int s = 0; s < kRanks; ++s) {
      const int64_t range = d.handle.layout_range.data<int64_t>()[e * kRanks + s];
      for (int64_t i = range >> 32; i < (range >> 32) + (range & 0xffffffff); ++i) {
        const int64_t token = d.handle.src_info.data<int32_t>()[e * rows + i];
        for (int64_t c = 0; c < kHidden; ++c)
          x.data<uint16_t>()[(e * rows + i) * kHidden + c] =
              expert_value(int64_t{me} * kLocal + e, s, token, c);
      }
    }
  return x;
}

inline void check_combine(const ep::Tensor& got, const ep::RankInputs& mine, int me) {
  std::vector<uint16_t> row(kHidden);
  const ep::Tensor want = ep::reference_ll_combine(
      mine.topk_idx, mine.topk_weights, kHidden, me, [&](int64_t expert, int home, int64_t token) {
        for (int64_t c = 0; c < kHidden; ++c)
          row[c] = expert_value(expert, home, token, c);
        return row.data();
      });
  require(got.bytes() == want.bytes() && std::memcmp(got.raw(), want.raw(), want.bytes()) == 0,
          "test", "combine differs from the reference");
}

}  // namespace proxyep::integrations::testing::ll
