#include "gpu_side/ep/workload.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && a.bytes() == b.bytes() && a.rows() == b.rows() &&
         a.cols() == b.cols() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

WorkloadOptions small_options() {
  WorkloadOptions o;
  o.shape = EpShape{4, 2, 32};
  o.num_tokens = 64;
  o.hidden = 256;
  o.topk = 6;
  o.seed = 99;
  return o;
}

// max / mean of tokens per expert over all ranks' inputs.
double expert_imbalance(const WorkloadOptions& o) {
  std::vector<int64_t> per_expert(o.shape.num_experts, 0);
  for (int r = 0; r < o.shape.num_ranks; ++r) {
    RankInputs in = make_rank_inputs(o, r);
    DispatchLayout layout = compute_dispatch_layout(in.topk_idx, o.shape);
    for (int e = 0; e < o.shape.num_experts; ++e)
      per_expert[e] += layout.num_tokens_per_expert.data<int32_t>()[e];
  }
  double mean = 0;
  for (int64_t n : per_expert)
    mean += static_cast<double>(n);
  mean /= static_cast<double>(per_expert.size());
  return static_cast<double>(*std::max_element(per_expert.begin(), per_expert.end())) / mean;
}

}  // namespace

TEST_CASE("workload: the same seed and rank give identical bytes; others differ") {
  WorkloadOptions o = small_options();
  o.fp8 = true;
  o.drop_fraction = 0.1;
  RankInputs a = make_rank_inputs(o, 1);
  RankInputs b = make_rank_inputs(o, 1);
  CHECK(same_bytes(a.x, b.x));
  CHECK(same_bytes(a.x_fp8, b.x_fp8));
  CHECK(same_bytes(a.x_scales, b.x_scales));
  CHECK(same_bytes(a.topk_idx, b.topk_idx));
  CHECK(same_bytes(a.topk_weights, b.topk_weights));

  RankInputs other_rank = make_rank_inputs(o, 2);
  CHECK_FALSE(same_bytes(a.x, other_rank.x));
  CHECK_FALSE(same_bytes(a.topk_idx, other_rank.topk_idx));
  CHECK_FALSE(same_bytes(a.topk_weights, other_rank.topk_weights));

  WorkloadOptions reseeded = o;
  reseeded.seed = 100;
  RankInputs other_seed = make_rank_inputs(reseeded, 1);
  CHECK_FALSE(same_bytes(a.x, other_seed.x));
  CHECK_FALSE(same_bytes(a.topk_idx, other_seed.topk_idx));

  // Routing does not depend on hidden (separate generator per purpose).
  WorkloadOptions wider = o;
  wider.hidden = 512;
  CHECK(same_bytes(a.topk_idx, make_rank_inputs(wider, 1).topk_idx));
}

TEST_CASE("workload: routing alone, then chosen rows of x, match the whole inputs") {
  WorkloadOptions o = small_options();
  o.fp8 = true;
  const RankInputs whole = make_rank_inputs(o, 2);
  RankInputs part = make_rank_routing(o, 2);
  CHECK_FALSE(part.x.defined());
  CHECK(same_bytes(part.topk_idx, whole.topk_idx));
  CHECK(same_bytes(part.topk_weights, whole.topk_weights));
  const std::vector<int64_t> rows = {0, 7, 8, 63};
  make_x_rows(o, 2, rows, part);
  const size_t row_bytes = static_cast<size_t>(o.hidden) * 2;
  for (int64_t t = 0; t < o.num_tokens; ++t) {
    CAPTURE(t);
    const bool chosen = std::find(rows.begin(), rows.end(), t) != rows.end();
    const bool equal =
        std::memcmp(part.x.raw() + t * row_bytes, whole.x.raw() + t * row_bytes, row_bytes) == 0;
    CHECK(equal == chosen);  // the others stay zero
    if (chosen) {
      CHECK(std::memcmp(part.x_fp8.raw() + t * o.hidden, whole.x_fp8.raw() + t * o.hidden,
                        static_cast<size_t>(o.hidden)) == 0);
      CHECK(std::memcmp(part.x_scales.raw() + t * part.x_scales.cols() * 4,
                        whole.x_scales.raw() + t * whole.x_scales.cols() * 4,
                        static_cast<size_t>(whole.x_scales.cols()) * 4) == 0);
    }
  }
  const std::vector<int64_t> outside = {64};
  CHECK_THROWS_AS(make_x_rows(o, 2, outside, part), Error);
}

TEST_CASE("workload: shapes, distinct experts and positive weights") {
  WorkloadOptions o = small_options();
  o.tokens_per_rank = {64, 0, 5, 130};
  for (int rank = 0; rank < 4; ++rank) {
    RankInputs in = make_rank_inputs(o, rank);
    const int64_t n = o.tokens_per_rank[rank];
    CHECK(in.x.dtype() == DType::bf16);
    CHECK(in.x.rows() == n);
    CHECK(in.x.cols() == o.hidden);
    CHECK(in.topk_idx.dtype() == DType::i64);
    CHECK(in.topk_idx.rows() == n);
    CHECK(in.topk_idx.cols() == o.topk);
    CHECK(in.topk_weights.dtype() == DType::f32);
    CHECK_FALSE(in.x_fp8.defined());
    for (int64_t t = 0; t < n; ++t) {
      std::set<int64_t> row;
      for (int k = 0; k < o.topk; ++k) {
        int64_t e = in.topk_idx.data<int64_t>()[t * o.topk + k];
        REQUIRE(e >= 0);
        REQUIRE(e < o.shape.num_experts);
        row.insert(e);
        REQUIRE(in.topk_weights.data<float>()[t * o.topk + k] > 0.0f);
      }
      REQUIRE(row.size() == size_t(o.topk));
    }
  }
}

TEST_CASE("workload: x looks like randn") {
  WorkloadOptions o = small_options();
  o.num_tokens = 256;
  o.hidden = 1024;
  RankInputs in = make_rank_inputs(o, 0);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < in.x.numel(); ++i) {
    double v = bf16_to_float(in.x.data<uint16_t>()[i]);
    sum += v;
    squares += v * v;
  }
  double n = static_cast<double>(in.x.numel());
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(squares / n - 1.0) < 0.02);
}

TEST_CASE("workload: drop_fraction replaces exactly that share of entries with -1") {
  WorkloadOptions o = small_options();
  o.drop_fraction = 0.25;
  RankInputs in = make_rank_inputs(o, 0);
  int64_t dropped = std::count(in.topk_idx.data<int64_t>(),
                               in.topk_idx.data<int64_t>() + in.topk_idx.numel(), -1);
  CHECK(dropped == std::llround(0.25 * 64 * 6));
  o.drop_fraction = 1.0;
  RankInputs all = make_rank_inputs(o, 0);
  CHECK(std::count(all.topk_idx.data<int64_t>(), all.topk_idx.data<int64_t>() + 64 * 6, -1) ==
        64 * 6);
}

TEST_CASE("workload: one-expert and skewed routing") {
  WorkloadOptions o = small_options();
  o.routing = Routing::one_expert;
  RankInputs one = make_rank_inputs(o, 3);
  for (int64_t t = 0; t < one.topk_idx.rows(); ++t)
    for (int k = 0; k < o.topk; ++k)
      REQUIRE(one.topk_idx.data<int64_t>()[t * o.topk + k] == (k == 0 ? 0 : -1));

  o.routing = Routing::random;
  o.num_tokens = 512;
  double uniform = expert_imbalance(o);
  o.routing = Routing::skewed;
  double skewed = expert_imbalance(o);
  CAPTURE(uniform);
  CAPTURE(skewed);
  CHECK(uniform < 1.5);
  CHECK(skewed > 2.0);
  CHECK(skewed > uniform + 0.5);
}

TEST_CASE("workload: fp8 cast follows DeepEP's per_token_cast_to_fp8") {
  WorkloadOptions o = small_options();
  o.fp8 = true;
  RankInputs in = make_rank_inputs(o, 0);
  REQUIRE(in.x_fp8.dtype() == DType::fp8_e4m3);
  REQUIRE(in.x_scales.dtype() == DType::f32);
  REQUIRE(in.x_scales.rows() == o.num_tokens);
  REQUIRE(in.x_scales.cols() == o.hidden / 128);
  for (int64_t t = 0; t < o.num_tokens; ++t) {
    for (int g = 0; g < o.hidden / 128; ++g) {
      float amax = 0;
      bool hit_max = false;
      for (int c = 0; c < 128; ++c)
        amax = std::max(amax,
                        std::abs(bf16_to_float(in.x.data<uint16_t>()[t * o.hidden + g * 128 + c])));
      float scale = in.x_scales.data<float>()[t * (o.hidden / 128) + g];
      REQUIRE(scale == std::max(amax, 1e-4f) / 448.0f);
      for (int c = 0; c < 128; ++c) {
        int64_t i = t * o.hidden + g * 128 + c;
        float x = bf16_to_float(in.x.data<uint16_t>()[i]);
        uint8_t code = in.x_fp8.data<uint8_t>()[i];
        hit_max = hit_max || (code & 0x7f) == 0x7e;
        float back = e4m3_to_float(code) * scale;
        // 3 mantissa bits: half an ulp is 1/16 relative; subnormals step 2^-9 (x scale).
        REQUIRE(std::abs(back - x) <= std::abs(x) / 16 + scale * 0x1.0p-10f + 1e-12f);
      }
      REQUIRE(hit_max);  // the group's largest value maps to +-448
    }
  }

  // A zero group: amax clamps to 1e-4 and everything encodes as 0.
  Tensor zeros = Tensor::zeros(DType::bf16, 1, 128);
  Tensor fp8, scales;
  cast_to_fp8(zeros, fp8, scales);
  CHECK(scales.data<float>()[0] == 1e-4f / 448.0f);
  CHECK(fp8.data<uint8_t>()[0] == 0);
  CHECK_THROWS_AS(cast_to_fp8(Tensor::zeros(DType::bf16, 1, 100), fp8, scales), Error);
}

namespace {

// Group g's UE8M0 byte of row t, read straight from memory: row t's int32s hold its groups'
// bytes in order (byte i of int32 j = group 4j + i, little-endian).
uint8_t ue8m0_byte(const Tensor& packed, int64_t t, int64_t g) {
  return reinterpret_cast<const uint8_t*>(packed.raw())[t * packed.cols() * 4 + g];
}

}  // namespace

TEST_CASE("workload: ue8m0 scales are packed power-of-two exponents that dequantise x") {
  WorkloadOptions o = small_options();
  o.fp8 = true;
  o.ue8m0 = true;
  o.hidden = 1024;
  const int groups = o.hidden / 128;
  RankInputs in = make_rank_inputs(o, 2);
  REQUIRE(in.x_fp8.dtype() == DType::fp8_e4m3);
  REQUIRE(in.x_scales.dtype() == DType::i32);
  REQUIRE(in.x_scales.rows() == o.num_tokens);
  REQUIRE(in.x_scales.cols() == o.hidden / 512);
  // The bf16 input is the f32 path's: only the cast differs.
  WorkloadOptions plain = o;
  plain.ue8m0 = false;
  REQUIRE(same_bytes(in.x, make_rank_inputs(plain, 2).x));

  for (int64_t t = 0; t < o.num_tokens; ++t) {
    for (int g = 0; g < groups; ++g) {
      CAPTURE(t);
      CAPTURE(g);
      const uint16_t* x = in.x.data<uint16_t>() + t * o.hidden + g * 128;
      const uint8_t* code = in.x_fp8.data<uint8_t>() + t * o.hidden + g * 128;
      float amax = 1e-4f;
      for (int c = 0; c < 128; ++c)
        amax = std::max(amax, std::abs(bf16_to_float(x[c])));
      // A valid biased exponent: 0 (2^-127) and 255 (NaN) never come out of a normal scale.
      const uint8_t byte = ue8m0_byte(in.x_scales, t, g);
      REQUIRE(byte >= 1);
      REQUIRE(byte <= 254);
      const double scale = std::ldexp(1.0, byte - 127);
      // Rounded up (up to float rounding of amax / 448), and the smallest such power of two.
      const double needed = static_cast<double>(amax) / 448.0;
      REQUIRE(scale >= needed * (1.0 - 0x1.0p-22));
      REQUIRE(scale / 2 < needed);
      float largest = 0.0f;
      for (int c = 0; c < 128; ++c) {
        const float value = bf16_to_float(x[c]);
        const float back = e4m3_to_float(code[c]) * static_cast<float>(scale);
        largest = std::max(largest, std::abs(e4m3_to_float(code[c])));
        // 3 mantissa bits: half an ulp is 1/16 relative; subnormals step 2^-9 (x scale).
        REQUIRE(std::abs(back - value) <=
                std::abs(value) / 16 + static_cast<float>(scale) * 0x1.0p-10f + 1e-12f);
      }
      // The payload was computed with the rounded scale: amax / scale lies in (224, 448], so the
      // largest code is in [224, 448] (e4m3 steps by 32 there).
      REQUIRE(largest >= 224.0f);
      REQUIRE(largest <= 448.0f);
    }
  }
}

TEST_CASE("workload: ue8m0 packing of hand-picked groups") {
  // Groups with amax 1, 3, 0 and 96: 2^ceil(log2(amax / 448)) = 2^-8, 2^-7, 2^-22 (1e-4 clamp),
  // 2^-2, i.e. biased exponents 119, 120, 105 and 125.
  Tensor x = Tensor::zeros(DType::bf16, 1, 512);
  uint16_t* v = x.data<uint16_t>();
  v[5] = float_to_bf16(1.0f);
  v[128 + 7] = float_to_bf16(-3.0f);
  v[128 + 8] = float_to_bf16(1.5f);
  v[384] = float_to_bf16(96.0f);
  Tensor fp8, scales;
  cast_to_fp8_ue8m0(x, fp8, scales);
  REQUIRE(scales.dtype() == DType::i32);
  REQUIRE(scales.cols() == 1);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(scales.raw());
  CHECK(bytes[0] == 119);
  CHECK(bytes[1] == 120);
  CHECK(bytes[2] == 105);
  CHECK(bytes[3] == 125);
  // Little-endian packing: group 4j + i in bits [8i, 8i + 8) of int32 j (on this host's order).
  uint32_t word = 0;
  std::memcpy(&word, scales.raw(), 4);
  uint32_t expected = 119u | 120u << 8 | 105u << 16 | 125u << 24;
  uint8_t expected_bytes[4];
  std::memcpy(expected_bytes, &expected, 4);
  CHECK(std::memcmp(bytes, expected_bytes, 4) == 0);
  // Payload = x / scale exactly (power-of-two scale): 1 * 2^8 = 256, -3 * 2^7 = -384,
  // 1.5 * 2^7 = 192, 96 * 2^2 = 384.
  CHECK(e4m3_to_float(fp8.data<uint8_t>()[5]) == 256.0f);
  CHECK(e4m3_to_float(fp8.data<uint8_t>()[128 + 7]) == -384.0f);
  CHECK(e4m3_to_float(fp8.data<uint8_t>()[128 + 8]) == 192.0f);
  CHECK(e4m3_to_float(fp8.data<uint8_t>()[384]) == 384.0f);
  CHECK(fp8.data<uint8_t>()[256] == 0);

  CHECK_THROWS_WITH_AS(cast_to_fp8_ue8m0(Tensor::zeros(DType::bf16, 1, 384), fp8, scales),
                       doctest::Contains("multiple of 512"), Error);
  Tensor infinite = Tensor::zeros(DType::bf16, 1, 512);
  infinite.data<uint16_t>()[300] = 0x7f80;  // +inf
  CHECK_THROWS_WITH_AS(cast_to_fp8_ue8m0(infinite, fp8, scales), doctest::Contains("infinity"),
                       Error);
}

TEST_CASE("workload: ue8m0 needs hidden % 512 with fp8 and is ignored without it") {
  WorkloadOptions o = small_options();
  o.ue8m0 = true;
  o.hidden = 384;
  RankInputs no_fp8 = make_rank_inputs(o, 0);
  CHECK_FALSE(no_fp8.x_fp8.defined());
  CHECK_FALSE(no_fp8.x_scales.defined());
  o.fp8 = true;
  CHECK_THROWS_WITH_AS(make_rank_inputs(o, 0), doctest::Contains("multiple of 512 for UE8M0"),
                       Error);
}

TEST_CASE("workload: options are validated") {
  WorkloadOptions o = small_options();
  auto bad = [&](auto change, const char* text) {
    WorkloadOptions copy = o;
    change(copy);
    CHECK_THROWS_WITH_AS(make_rank_inputs(copy, 0), doctest::Contains(text), Error);
  };
  bad([](WorkloadOptions& c) { c.shape.num_experts = 30; }, "multiple of num_ranks");
  bad([](WorkloadOptions& c) { c.topk = 40; }, "topk");
  bad([](WorkloadOptions& c) { c.topk = 0; }, "topk");
  bad([](WorkloadOptions& c) { c.shape.num_experts = 4; }, "exceeds num_experts");
  bad(
      [](WorkloadOptions& c) {
        c.fp8 = true;
        c.hidden = 100;
      },
      "multiple of 128");
  bad([](WorkloadOptions& c) { c.tokens_per_rank = {1, 2}; }, "one per rank");
  bad([](WorkloadOptions& c) { c.drop_fraction = 1.5; }, "drop_fraction");
  bad([](WorkloadOptions& c) { c.num_tokens = -1; }, "num_tokens");
  CHECK_THROWS_WITH_AS(make_rank_inputs(o, 4), doctest::Contains("workload: rank 4"), Error);

  CHECK(parse_routing("random") == Routing::random);
  CHECK(parse_routing("skewed") == Routing::skewed);
  CHECK(parse_routing("one-expert") == Routing::one_expert);
  for (Routing r : {Routing::random, Routing::skewed, Routing::one_expert})
    CHECK(parse_routing(routing_name(r)) == r);
  CHECK_THROWS_WITH_AS(parse_routing("zipf"), doctest::Contains("unknown routing 'zipf'"), Error);
}
