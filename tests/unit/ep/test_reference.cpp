#include "gpu_side/ep/reference.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

using namespace proxyep;
using namespace proxyep::ep;

namespace {

struct World {
  WorkloadOptions options;
  std::vector<RankInputs> inputs;
  std::vector<DispatchInputs> views;
  std::vector<DispatchLayout> layouts;
};

World make_world(bool fp8) {
  World w;
  w.options.shape = EpShape{4, 2, 16};
  w.options.tokens_per_rank = {50, 0, 37, 64};
  w.options.hidden = 256;
  w.options.topk = 4;
  w.options.drop_fraction = 0.2;
  w.options.fp8 = fp8;
  w.options.seed = 5;
  for (int r = 0; r < 4; ++r) {
    w.inputs.push_back(make_rank_inputs(w.options, r));
    const RankInputs& in = w.inputs.back();
    w.views.push_back(fp8 ? DispatchInputs{in.x_fp8, in.x_scales, in.topk_idx, in.topk_weights}
                          : DispatchInputs{in.x, {}, in.topk_idx, in.topk_weights});
    w.layouts.push_back(compute_dispatch_layout(in.topk_idx, w.options.shape));
  }
  return w;
}

bool row_equal(const Tensor& a, int64_t row_a, const Tensor& b, int64_t row_b) {
  size_t bytes = static_cast<size_t>(a.cols()) * dtype_size(a.dtype());
  return std::memcmp(a.raw() + row_a * bytes, b.raw() + row_b * bytes, bytes) == 0;
}

}  // namespace

TEST_CASE("reference: dispatch agrees with the layout and keeps DeepEP's receive order") {
  for (bool fp8 : {false, true}) {
    CAPTURE(fp8);
    World w = make_world(fp8);
    const EpShape& shape = w.options.shape;
    const int local = shape.experts_per_rank();
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      ReferenceDispatch d = reference_dispatch(w.views, shape, rank);
      ReferenceDispatch aligned = reference_dispatch(w.views, shape, rank, 8);
      int64_t expected_rows = 0;
      for (int s = 0; s < 4; ++s) {
        int from_s = w.layouts[s].num_tokens_per_rank.data<int32_t>()[rank];
        CHECK(d.recv_from[s] == from_s);
        expected_rows += from_s;
      }
      REQUIRE(d.recv_x.rows() == expected_rows);
      CHECK(d.recv_x.dtype() == (fp8 ? DType::fp8_e4m3 : DType::bf16));
      CHECK(d.recv_x_scales.defined() == fp8);
      REQUIRE(d.recv_topk_idx.rows() == expected_rows);
      REQUIRE(d.recv_topk_weights.rows() == expected_rows);
      REQUIRE(d.recv_src_idx.rows() == expected_rows);

      for (int e = 0; e < local; ++e) {
        int pairs = 0;
        for (int s = 0; s < 4; ++s)
          pairs += w.layouts[s].num_tokens_per_expert.data<int32_t>()[rank * local + e];
        CHECK(d.num_recv_tokens_per_expert[e] == pairs);
        CHECK(aligned.num_recv_tokens_per_expert[e] == (pairs + 7) / 8 * 8);
      }

      int64_t row = 0;
      for (int s = 0; s < 4; ++s) {
        const RankInputs& src = w.inputs[s];
        int64_t previous = -1;
        for (int i = 0; i < d.recv_from[s]; ++i, ++row) {
          int64_t t = d.recv_src_idx.data<int32_t>()[row];
          REQUIRE(t > previous);  // ascending token order within a source
          previous = t;
          REQUIRE(w.layouts[s].is_token_in_rank.data<bool>()[t * 4 + rank]);
          REQUIRE(row_equal(d.recv_x, row, fp8 ? src.x_fp8 : src.x, t));
          if (fp8) REQUIRE(row_equal(d.recv_x_scales, row, src.x_scales, t));
          for (int k = 0; k < 4; ++k) {
            int64_t e = src.topk_idx.data<int64_t>()[t * 4 + k];
            int64_t got = d.recv_topk_idx.data<int64_t>()[row * 4 + k];
            float weight = d.recv_topk_weights.data<float>()[row * 4 + k];
            bool mine = e >= rank * local && e < (rank + 1) * local;
            REQUIRE(got == (mine ? e - rank * local : -1));
            REQUIRE(weight == (mine ? src.topk_weights.data<float>()[t * 4 + k] : 0.0f));
          }
        }
      }
    }
  }
}

TEST_CASE("reference: column-major scales are read through their strides") {
  World w = make_world(true);
  const RankInputs& in = w.inputs[3];
  const int64_t n = in.x_scales.rows(), groups = in.x_scales.cols();
  std::vector<float> column_major(static_cast<size_t>(n * groups));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < groups; ++g)
      column_major[g * n + t] = in.x_scales.data<float>()[t * groups + g];
  std::vector<DispatchInputs> views = w.views;
  views[3].x_scales = TensorRef::strided(column_major.data(), DType::f32, n, groups, 1, n);
  for (int rank = 0; rank < 4; ++rank) {
    ReferenceDispatch a = reference_dispatch(w.views, w.options.shape, rank);
    ReferenceDispatch b = reference_dispatch(views, w.options.shape, rank);
    REQUIRE(a.recv_x_scales.bytes() == b.recv_x_scales.bytes());
    CHECK(std::memcmp(a.recv_x_scales.raw(), b.recv_x_scales.raw(), a.recv_x_scales.bytes()) == 0);
  }
}

TEST_CASE("reference: combining the dispatched rows gives count * x and the original weights") {
  World w = make_world(false);
  const EpShape& shape = w.options.shape;
  std::vector<ReferenceDispatch> dispatched;
  std::vector<TensorRef> expert_out, weights;
  for (int r = 0; r < 4; ++r)
    dispatched.push_back(reference_dispatch(w.views, shape, r));
  for (const ReferenceDispatch& d : dispatched) {
    expert_out.push_back(d.recv_x);
    weights.push_back(d.recv_topk_weights);
  }
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const RankInputs& in = w.inputs[rank];
    const int n = w.options.tokens_of(rank);
    ReferenceCombine c = reference_combine(expert_out, dispatched, weights, shape, rank, n);
    REQUIRE(c.combined_x.rows() == n);
    REQUIRE(c.combined_x.cols() == w.options.hidden);
    REQUIRE(c.combined_topk_weights.defined());
    for (int64_t t = 0; t < n; ++t) {
      int count = 0;
      for (int r = 0; r < 4; ++r)
        count += w.layouts[rank].is_token_in_rank.data<bool>()[t * 4 + r];
      // count copies of a bf16 value add exactly in float, so only the final rounding remains.
      for (int64_t c_ = 0; c_ < w.options.hidden; ++c_) {
        int64_t i = t * w.options.hidden + c_;
        float x = bf16_to_float(in.x.data<uint16_t>()[i]);
        REQUIRE(c.combined_x.data<uint16_t>()[i] == float_to_bf16(static_cast<float>(count) * x));
      }
      for (int k = 0; k < 4; ++k) {
        int64_t e = in.topk_idx.data<int64_t>()[t * 4 + k];
        float original = in.topk_weights.data<float>()[t * 4 + k];
        REQUIRE(c.combined_topk_weights.data<float>()[t * 4 + k] == (e >= 0 ? original : 0.0f));
      }
    }
  }

  // Without weights there are no combined weights; biases are added after the sum.
  Tensor bias0 = Tensor::empty(DType::bf16, 50, 256), bias1 = Tensor::empty(DType::bf16, 50, 256);
  for (int64_t i = 0; i < bias0.numel(); ++i) {
    bias0.data<uint16_t>()[i] = float_to_bf16(0.5f);
    bias1.data<uint16_t>()[i] = float_to_bf16(static_cast<float>(i % 7) - 3.0f);
  }
  ReferenceCombine plain = reference_combine(expert_out, dispatched, {}, shape, 0, 50);
  ReferenceCombine biased =
      reference_combine(expert_out, dispatched, {}, shape, 0, 50, bias0, bias1);
  CHECK_FALSE(plain.combined_topk_weights.defined());
  for (int64_t i = 0; i < bias0.numel(); ++i) {
    // plain is already bf16-rounded; recompute the float sum the way the reference must.
    int64_t t = i / 256;
    int count = 0;
    for (int r = 0; r < 4; ++r)
      count += w.layouts[0].is_token_in_rank.data<bool>()[t * 4 + r];
    float sum = static_cast<float>(count) * bf16_to_float(w.inputs[0].x.data<uint16_t>()[i]);
    float expected = (sum + 0.5f) + (static_cast<float>(i % 7) - 3.0f);
    REQUIRE(biased.combined_x.data<uint16_t>()[i] == float_to_bf16(expected));
  }
}

TEST_CASE("reference: malformed inputs are rejected") {
  World w = make_world(false);
  const EpShape& shape = w.options.shape;
  std::vector<DispatchInputs> three(w.views.begin(), w.views.begin() + 3);
  CHECK_THROWS_WITH_AS(reference_dispatch(three, shape, 0), doctest::Contains("inputs of 3 ranks"),
                       Error);
  CHECK_THROWS_AS(reference_dispatch(w.views, shape, 4), Error);
  CHECK_THROWS_AS(reference_dispatch(w.views, shape, 0, 0), Error);
  std::vector<DispatchInputs> narrow = w.views;
  Tensor x = Tensor::zeros(DType::bf16, 37, 128);
  narrow[2].x = x;
  CHECK_THROWS_WITH_AS(reference_dispatch(narrow, shape, 0), doctest::Contains("x must have shape"),
                       Error);
  std::vector<DispatchInputs> no_weights = w.views;
  no_weights[1].topk_weights = {};
  CHECK_THROWS_WITH_AS(reference_dispatch(no_weights, shape, 0),
                       doctest::Contains("all ranks or none"), Error);
  std::vector<DispatchInputs> fp8_without_scales = w.views;
  Tensor fp8 = Tensor::zeros(DType::fp8_e4m3, 50, 256);
  for (auto& v : fp8_without_scales)
    v.x = fp8;
  CHECK_THROWS_AS(reference_dispatch(fp8_without_scales, shape, 0), Error);
}
