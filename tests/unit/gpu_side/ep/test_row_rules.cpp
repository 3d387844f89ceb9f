// The per-row rules (gpu_side/ep/row_rules.hpp) checked against values worked out by hand, not
// against another implementation of the same rule: a received row's weights are zero wherever
// its index is -1 for the destination, and combine sums more than two sources in float32, ranks
// ascending, then bias0 and bias1, and rounds to bf16 once -- combine_token (what the CUDA kernel
// runs) and the host reduce alike. Each combine case is chosen so that accumulating in bf16, in
// double, or in another order gives other bits, and the test shows it does.
#include "gpu_side/ep/host_reduce.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace proxyep::gpu_side::ep;

TEST_CASE("dispatch_row: weights are zeroed exactly where the destination's index is -1") {
  // 4 ranks of 4 experts; token 0 names experts 5 (rank 1), -1 (dropped), 9 (rank 2), 6 (rank 1).
  const EpShape shape{4, 2, 16};
  RowFormat format;
  format.hidden_bytes = 32;
  format.topk = 4;
  format.weights = 4;
  format.src_index = 1;
  std::array<std::byte, 2 * 32> x{};
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<std::byte>(i * 7 + 1);
  const std::array<int64_t, 8> topk_idx = {5, -1, 9, 6, /* token 1 */ 0, 1, 2, 3};
  const std::array<float, 8> weights = {0.25f, 0.5f, -1.5f, 3.0f, 1, 2, 3, 4};
  RowInput in;
  in.x = x.data();
  in.topk_idx = topk_idx.data();
  in.topk_weights = weights.data();
  in.format = format;
  in.shape = shape;

  for (int dst : {1, 2, 3}) {
    CAPTURE(dst);
    const RowAreas areas = RowAreas::of(2, format);
    std::vector<std::byte> arena(areas.end, std::byte{0xee});  // poison: every byte is written
    const RowSink sink = RowSink::at(arena.data(), areas, 0, dst);
    dispatch_row(in, sink, /*row=*/1, /*t=*/0, HostLanes{});
    const int64_t* idx = sink.topk_idx + 4;
    const float* w = sink.weights + 4;
    const std::array<int64_t, 4> want_idx = dst == 1   ? std::array<int64_t, 4>{1, -1, -1, 2}
                                            : dst == 2 ? std::array<int64_t, 4>{-1, -1, 1, -1}
                                                       : std::array<int64_t, 4>{-1, -1, -1, -1};
    const std::array<float, 4> want_w = dst == 1   ? std::array<float, 4>{0.25f, 0, 0, 3.0f}
                                        : dst == 2 ? std::array<float, 4>{0, 0, -1.5f, 0}
                                                   : std::array<float, 4>{0, 0, 0, 0};
    for (int k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(idx[k] == want_idx[k]);
      // +0.0 exactly, bit for bit, where the index is -1 (the dropped entry's 0.5 included).
      CHECK(float_to_bits(w[k]) == float_to_bits(want_w[k]));
    }
    CHECK(std::memcmp(sink.x + 32, x.data(), 32) == 0);
    CHECK(sink.src_index[1] == 0);
  }
}

namespace {

constexpr uint16_t kOne = 0x3f80;           // 1.0
constexpr uint16_t kEighth = 0x3b80;        // 2^-8: half a bf16 ulp of 1.0
constexpr uint16_t kBig = 0x4b80;           // 2^24: a float32 ulp of 2 there, so + 1 is lost
constexpr uint16_t kMinusBig = 0xcb80;      // -2^24
constexpr uint16_t kOnePlus2 = 0x3f82;      // 1 + 2/128
constexpr uint16_t kTwo = 0x4000;           // 2.0
constexpr int64_t kHidden = kCombineChunk;  // one chunk: elements 0 and 1 carry the cases

// Three tokens over four ranks; every rank returned one row per token it received (row t of its
// block is token t), some tokens skipped one rank (head -1, its row must not count).
struct Combine {
  static constexpr int kRanks = 4, kTokens = 3, kTopk = 1;
  alignas(64) std::array<std::array<uint16_t, kTokens * kHidden>, kRanks> rows{};  // rows 16 B
  std::array<std::array<float, kTokens * kTopk>, kRanks> weights{};
  std::array<int32_t, kTokens * kRanks> head{};
  alignas(64) std::array<uint16_t, kTokens * kHidden> bias0{};
  alignas(64) std::array<uint16_t, kTokens * kHidden> bias1{};
  std::array<const uint16_t*, kRanks> row_ptrs{};
  std::array<const float*, kRanks> weight_ptrs{};

  // Token t's element e: v[r] in rank r's row (counted only where head says r received t).
  void element(int t, int e, std::array<uint16_t, kRanks> v, uint16_t b0 = 0, uint16_t b1 = 0) {
    for (int r = 0; r < kRanks; ++r)
      rows[r][t * kHidden + e] = v[r];
    bias0[t * kHidden + e] = b0;
    bias1[t * kHidden + e] = b1;
  }

  CombineInput input(uint16_t* out, float* out_weights) {
    for (int r = 0; r < kRanks; ++r) {
      row_ptrs[r] = rows[r].data();
      weight_ptrs[r] = weights[r].data();
    }
    CombineInput in;
    in.block_rows = row_ptrs.data();
    in.block_weights = weight_ptrs.data();
    in.send_head = head.data();
    in.bias0 = bias0.data();
    in.bias1 = bias1.data();
    in.out = out;
    in.out_weights = out_weights;
    in.num_ranks = kRanks;
    in.hidden = kHidden;
    in.topk = kTopk;
    return in;
  }
};

// The same sum the way a wrong reduce would do it, to show the case tells them apart.
enum class Wrong { bf16_accumulator, descending_ranks, double_accumulator, biases_first };
uint16_t wrong_sum(const Combine& c, int t, int e, Wrong how) {
  std::vector<float> terms;
  for (int r = 0; r < Combine::kRanks; ++r)
    if (c.head[t * Combine::kRanks + r] >= 0)
      terms.push_back(bf16_to_float(c.rows[r][t * kHidden + e]));
  const float b0 = bf16_to_float(c.bias0[t * kHidden + e]),
              b1 = bf16_to_float(c.bias1[t * kHidden + e]);
  switch (how) {
    case Wrong::bf16_accumulator: {
      float acc = 0;
      for (float v : terms)
        acc = bf16_to_float(float_to_bf16(acc + v));
      acc = bf16_to_float(float_to_bf16(acc + b0));
      return float_to_bf16(acc + b1);
    }
    case Wrong::descending_ranks: {
      float acc = 0;
      for (auto v = terms.rbegin(); v != terms.rend(); ++v)
        acc += *v;
      return float_to_bf16(acc + b0 + b1);
    }
    case Wrong::double_accumulator: {
      double acc = 0;
      for (float v : terms)
        acc += v;
      return float_to_bf16(static_cast<float>(acc + b0 + b1));
    }
    case Wrong::biases_first: {
      float acc = b0 + b1;
      for (float v : terms)
        acc += v;
      return float_to_bf16(acc);
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("combine: float32 sums over more than two sources, ranks ascending, rounded once") {
  Combine c;
  // Token 0, all four ranks. Element 0: 1 + 2^-8 + 2^-8 + 2^-8 = 1 + 3/256 in float32, which
  // rounds (a tie) to the even 1 + 2/128; a bf16 accumulator loses every 2^-8 (1 + 2^-8 is a tie
  // that rounds back to 1). Element 1: 2^24 + 1 + 1 + 0 - 2^24 (bias0) is 0 in float32 ranks
  // ascending (each + 1 is lost at 2^24); descending, biases first, or in double it is 2.
  c.element(0, 0, {kOne, kEighth, kEighth, kEighth});
  c.element(0, 1, {kBig, kOne, kOne, 0}, kMinusBig);
  // Token 1: rank 1 did not receive it; its row holds values that would change both results.
  c.element(1, 0, {kOne, kBig, kEighth, kEighth}, kEighth);
  c.element(1, 1, {kBig, kBig, kOne, kOne}, 0, kMinusBig);
  // Token 2: only ranks 2 and 3, plus both biases: 2^24 + 1 + 1 - 2^24 again, over four terms.
  c.element(2, 0, {kTwo, kTwo, kBig, kOne}, kOne, kMinusBig);
  c.head = {0, 0, 0, 0, /* token 1 */ 1, -1, 1, 1, /* token 2 */ -1, -1, 2, 2};
  // Weights: 2^24 + 1 + 1 in float32 ranks ascending is 2^24; in any other order 2^24 + 2.
  for (int r = 0; r < Combine::kRanks; ++r)
    for (int t = 0; t < Combine::kTokens; ++t)
      c.weights[r][t] = r == 0 ? 16777216.0f : r == 3 ? 0.0f : 1.0f;
  c.weights[1][1] = 1e30f;  // rank 1 did not receive token 1: never added

  const std::array<uint16_t, Combine::kTokens* kHidden> want = {
      kOnePlus2, 0, 0, 0, 0, 0, 0, 0,  // token 0
      kOnePlus2, 0, 0, 0, 0, 0, 0, 0,  // token 1: 1 + 2^-8 + 2^-8 + 2^-8 (bias0)
      0,         0, 0, 0, 0, 0, 0, 0,  // token 2: 2^24 + 1 + 1 - 2^24
  };
  // Token 1's element 1 is 2^24 + 1 + 1 + 0 - 2^24 = 0 as well; listed apart for the comment.
  const std::array<float, Combine::kTokens> want_weights = {16777216.0f, 16777216.0f, 1.0f};

  // The cases discriminate: each wrong reduce gets at least one element wrong.
  CHECK(wrong_sum(c, 0, 0, Wrong::bf16_accumulator) == kOne);
  CHECK(wrong_sum(c, 0, 1, Wrong::descending_ranks) == kTwo);
  CHECK(wrong_sum(c, 0, 1, Wrong::double_accumulator) == kTwo);
  CHECK(wrong_sum(c, 0, 1, Wrong::biases_first) == kTwo);
  CHECK(wrong_sum(c, 2, 0, Wrong::biases_first) == kTwo);
  CHECK(wrong_sum(c, 2, 0, Wrong::double_accumulator) == kTwo);
  CHECK(16777216.0f + (1.0f + 1.0f) != want_weights[0]);  // descending order of the weights

  SUBCASE("combine_token (the CUDA kernel's rule)") {
    alignas(64) std::array<uint16_t, Combine::kTokens * kHidden> out{};
    std::array<float, Combine::kTokens> out_weights{};
    const CombineInput in = c.input(out.data(), out_weights.data());
    for (int64_t t = 0; t < Combine::kTokens; ++t)
      combine_token(in, t, HostLanes{});
    for (size_t i = 0; i < out.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i] == want[i]);
    }
    for (int t = 0; t < Combine::kTokens; ++t)
      CHECK(float_to_bits(out_weights[t]) == float_to_bits(want_weights[t]));
  }
  SUBCASE("the host reduce (the CPU twin)") {
    alignas(64) std::array<uint16_t, Combine::kTokens * kHidden> out{};
    std::array<float, Combine::kTokens> out_weights{};
    const CombineInput in = c.input(out.data(), out_weights.data());
    reduce_tokens_host(in, 0, Combine::kTokens);
    for (size_t i = 0; i < out.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i] == want[i]);
    }
    for (int t = 0; t < Combine::kTokens; ++t)
      CHECK(float_to_bits(out_weights[t]) == float_to_bits(want_weights[t]));
  }
}
