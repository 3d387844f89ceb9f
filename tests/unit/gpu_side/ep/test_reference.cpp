#include "gpu_side/ep/reference.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <utility>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

namespace {

struct World {
  WorkloadOptions options;
  std::vector<RankInputs> inputs;
  std::vector<DispatchInputs> views;
  std::vector<DispatchLayout> layouts;
};

// A copy of the row-major [rows, cols] `m` stored column-major (as DeepGEMM's TMA layout hands
// scales over): view it with TensorRef::strided(data, dtype, rows, cols, 1, rows).
template <typename T>
std::vector<T> column_major_copy(const Tensor& m) {
  const int64_t rows = m.rows(), cols = m.cols();
  std::vector<T> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(c * rows + r)] = m.data<T>()[r * cols + c];
  return out;
}

World make_world(bool fp8, bool ue8m0 = false) {
  World w;
  w.options.shape = EpShape{4, 2, 16};
  w.options.tokens_per_rank = {50, 0, 37, 64};
  w.options.hidden = ue8m0 ? 1024 : 256;  // UE8M0 packs four 128-channel groups per int32
  w.options.topk = 4;
  w.options.drop_fraction = 0.2;
  w.options.fp8 = fp8;
  w.options.ue8m0 = ue8m0;
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

// Row `row` of a strided view equals row `row_b` of contiguous `b`, element by element.
bool strided_row_equal(const TensorRef& a, int64_t row, const Tensor& b, int64_t row_b) {
  const size_t element = dtype_size(a.dtype);
  const auto* base = static_cast<const std::byte*>(a.data);
  for (int64_t c = 0; c < a.cols; ++c) {
    const std::byte* from = base + (row * a.row_stride + c * a.col_stride) * element;
    if (std::memcmp(from, b.raw() + (row_b * b.cols() + c) * element, element) != 0) return false;
  }
  return true;
}

// Checks that `d`'s scale rows are the sources' rows, byte for byte, in receive order.
void check_scale_rows(const ReferenceDispatch& d, std::span<const DispatchInputs> views) {
  int64_t row = 0;
  for (size_t s = 0; s < views.size(); ++s) {
    for (int i = 0; i < d.recv_from[s]; ++i, ++row) {
      const int64_t t = d.recv_src_idx.data<int32_t>()[row];
      REQUIRE(strided_row_equal(views[s].x_scales, t, d.recv_x_scales, row));
    }
  }
  REQUIRE(row == d.recv_x_scales.rows());
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
  std::vector<float> column_major = column_major_copy<float>(in.x_scales);
  std::vector<DispatchInputs> views = w.views;
  views[3].x_scales = TensorRef::strided(column_major.data(), DType::f32, n, groups, 1, n);
  for (int rank = 0; rank < 4; ++rank) {
    ReferenceDispatch a = reference_dispatch(w.views, w.options.shape, rank);
    ReferenceDispatch b = reference_dispatch(views, w.options.shape, rank);
    REQUIRE(a.recv_x_scales.bytes() == b.recv_x_scales.bytes());
    CHECK(std::memcmp(a.recv_x_scales.raw(), b.recv_x_scales.raw(), a.recv_x_scales.bytes()) == 0);
  }
}

TEST_CASE("reference: UE8M0 scales arrive as int32 rows, byte for byte, in receive order") {
  World w = make_world(true, true);
  const EpShape& shape = w.options.shape;
  REQUIRE(w.inputs[0].x_scales.dtype() == DType::i32);
  // Column-major packed scales for rank 3 (as DeepGEMM's TMA layout hands them over).
  const RankInputs& in3 = w.inputs[3];
  const int64_t n = in3.x_scales.rows(), words = in3.x_scales.cols();
  std::vector<int32_t> column_major = column_major_copy<int32_t>(in3.x_scales);
  std::vector<DispatchInputs> strided = w.views;
  strided[3].x_scales = TensorRef::strided(column_major.data(), DType::i32, n, words, 1, n);

  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    ReferenceDispatch d = reference_dispatch(w.views, shape, rank);
    REQUIRE(d.recv_x_scales.dtype() == DType::i32);
    REQUIRE(d.recv_x_scales.cols() == w.options.hidden / 512);
    REQUIRE(d.recv_x_scales.rows() == d.recv_x.rows());
    int64_t row = 0;
    for (int s = 0; s < 4; ++s) {
      int64_t previous = -1;
      for (int i = 0; i < d.recv_from[s]; ++i, ++row) {
        const int64_t t = d.recv_src_idx.data<int32_t>()[row];
        REQUIRE(t > previous);  // source rank, then token, ascending
        previous = t;
        REQUIRE(w.layouts[s].is_token_in_rank.data<bool>()[t * 4 + rank]);
        REQUIRE(row_equal(d.recv_x_scales, row, w.inputs[s].x_scales, t));
        REQUIRE(row_equal(d.recv_x, row, w.inputs[s].x_fp8, t));
      }
    }
    ReferenceDispatch b = reference_dispatch(strided, shape, rank);
    REQUIRE(b.recv_x_scales.bytes() == d.recv_x_scales.bytes());
    CHECK(std::memcmp(b.recv_x_scales.raw(), d.recv_x_scales.raw(), d.recv_x_scales.bytes()) == 0);
  }
}

TEST_CASE("reference: fp8 scales of any column count and any hidden move as raw bytes") {
  World w = make_world(false);
  const EpShape& shape = w.options.shape;
  const int64_t hidden = 100;  // not a multiple of 128: DeepEP's normal mode does not care
  for (const auto& param : {std::pair{DType::i32, int64_t{3}}, std::pair{DType::f32, int64_t{1}}}) {
    // Plain variables, not a structured binding: CAPTURE's lambda cannot use one before Clang 16.
    const DType dtype = param.first;
    const int64_t cols = param.second;
    CAPTURE(dtype_name(dtype));
    CAPTURE(cols);
    std::vector<Tensor> xs;
    std::vector<std::vector<uint32_t>> scales(4);  // column-major, distinct per (rank, token, col)
    std::vector<DispatchInputs> views = w.views;
    for (int r = 0; r < 4; ++r) {
      const int64_t n = w.options.tokens_of(r);
      xs.push_back(Tensor::empty(DType::fp8_e4m3, n, hidden));
      for (int64_t i = 0; i < xs.back().numel(); ++i)
        xs.back().data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + r);
      scales[r].resize(static_cast<size_t>(n * cols));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < cols; ++c)
          scales[r][c * n + t] = static_cast<uint32_t>(r << 24 | t << 8 | c) ^ 0x80808080u;
      views[r].x = xs.back();
      views[r].x_scales = TensorRef::strided(scales[r].data(), dtype, n, cols, 1, n);
    }
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      ReferenceDispatch d = reference_dispatch(views, shape, rank);
      REQUIRE(d.recv_x_scales.dtype() == dtype);
      REQUIRE(d.recv_x_scales.cols() == cols);
      REQUIRE(d.recv_x.cols() == hidden);
      check_scale_rows(d, views);
    }
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

TEST_CASE("reference: by_node rounds each node's partial to bf16, then sums nodes ascending") {
  // 4 ranks, 2 per node; rank 0's token 0 reached every rank. Rank r returns the value v[r] in
  // every column and the weight w[r].
  const EpShape shape{4, 2, 4};
  const float v[4] = {1.0f, 0x1p-8f, 0x1p-8f, 0.0f};
  const float w[4] = {1.0f, 0.0f, 0x1p-24f, 0x1p-24f};
  std::vector<ReferenceDispatch> dispatched(4);
  std::vector<Tensor> rows, weights;
  for (int r = 0; r < 4; ++r) {
    dispatched[r].recv_from = {1, 0, 0, 0};
    dispatched[r].recv_src_idx = Tensor::zeros(DType::i32, 1);
    rows.push_back(Tensor::empty(DType::bf16, 1, 8));
    for (int c = 0; c < 8; ++c)
      rows.back().data<uint16_t>()[c] = float_to_bf16(v[r]);
    weights.push_back(Tensor::empty(DType::f32, 1, 1));
    weights.back().data<float>()[0] = w[r];
  }
  std::vector<TensorRef> expert_out(rows.begin(), rows.end());
  std::vector<TensorRef> weights_in(weights.begin(), weights.end());
  Tensor bias = Tensor::empty(DType::bf16, 1, 8);
  for (int c = 0; c < 8; ++c)
    bias.data<uint16_t>()[c] = float_to_bf16(c % 2 == 0 ? 0.0f : -1.0f);

  const ReferenceCombine by_rank = reference_combine(expert_out, dispatched, weights_in, shape, 0,
                                                     1, {}, {}, CombineOrder::by_rank);
  const ReferenceCombine by_node = reference_combine(expert_out, dispatched, weights_in, shape, 0,
                                                     1, bias, {}, CombineOrder::by_node);
  // by_rank: 1 + 2^-8 + 2^-8 + 0 = 1 + 2^-7, a bf16 value. by_node: node 0's partial
  // bf16(1 + 2^-8) is a tie that rounds to even (1.0), node 1's is 2^-8, and bf16(1 + 2^-8) = 1
  // again; the bias (0 or -1) is in the float32 sum before the last rounding, so the odd columns
  // keep 2^-8.
  for (int c = 0; c < 8; ++c) {
    CHECK(bf16_to_float(by_rank.combined_x.data<uint16_t>()[c]) == 1.0f + 0x1p-7f);
    CHECK(bf16_to_float(by_node.combined_x.data<uint16_t>()[c]) == (c % 2 == 0 ? 1.0f : 0x1p-8f));
  }
  // Weights stay float32 but associate by node: ((1 + 0) + 2^-24) + 2^-24 rounds to 1, while
  // (1 + 0) + (2^-24 + 2^-24) = 1 + 2^-23.
  CHECK(by_rank.combined_topk_weights.data<float>()[0] == 1.0f);
  CHECK(by_node.combined_topk_weights.data<float>()[0] == 1.0f + 0x1p-23f);

  // The biases come first, as DeepEP's final receiver adds them: (2^-24 + 2^-24) + 1 + 2^-8 is
  // past the tie and rounds up to 1 + 2^-7, where adding them last would give 1.
  Tensor tiny = Tensor::empty(DType::bf16, 1, 8);
  for (int c = 0; c < 8; ++c)
    tiny.data<uint16_t>()[c] = float_to_bf16(0x1p-24f);
  const ReferenceCombine biased = reference_combine(expert_out, dispatched, weights_in, shape, 0, 1,
                                                    tiny, tiny, CombineOrder::by_node);
  CHECK(bf16_to_float(biased.combined_x.data<uint16_t>()[0]) == 1.0f + 0x1p-7f);

  // A node that received nothing adds nothing (not a rounded zero): only node 1 has the token.
  for (int r = 0; r < 2; ++r) {
    dispatched[r].recv_from = {0, 0, 0, 0};
    dispatched[r].recv_src_idx = Tensor::zeros(DType::i32, 0);
    rows[r] = Tensor::empty(DType::bf16, 0, 8);
    weights[r] = Tensor::empty(DType::f32, 0, 1);
    expert_out[r] = rows[r];
    weights_in[r] = weights[r];
  }
  const ReferenceCombine remote = reference_combine(expert_out, dispatched, weights_in, shape, 0, 1,
                                                    {}, {}, CombineOrder::by_node);
  CHECK(bf16_to_float(remote.combined_x.data<uint16_t>()[0]) == 0x1p-8f);
  CHECK(remote.combined_topk_weights.data<float>()[0] == 0x1p-23f);
}

TEST_CASE("reference: by_node on one node is by_rank, bit for bit") {
  World w = make_world(false);
  EpShape one_node = w.options.shape;
  one_node.ranks_per_node = one_node.num_ranks;
  std::vector<ReferenceDispatch> dispatched;
  std::vector<TensorRef> expert_out, weights;
  for (int r = 0; r < one_node.num_ranks; ++r)
    dispatched.push_back(reference_dispatch(w.views, one_node, r));
  for (const ReferenceDispatch& d : dispatched) {
    expert_out.push_back(d.recv_x);
    weights.push_back(d.recv_topk_weights);
  }
  const int n = w.options.tokens_of(1);
  const ReferenceCombine a = reference_combine(expert_out, dispatched, weights, one_node, 1, n);
  const ReferenceCombine b = reference_combine(expert_out, dispatched, weights, one_node, 1, n, {},
                                               {}, CombineOrder::by_node);
  CHECK(std::memcmp(a.combined_x.raw(), b.combined_x.raw(), a.combined_x.bytes()) == 0);
  CHECK(std::memcmp(a.combined_topk_weights.raw(), b.combined_topk_weights.raw(),
                    a.combined_topk_weights.bytes()) == 0);
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

  World f = make_world(true);
  std::vector<DispatchInputs> wide_scales = f.views;
  Tensor i64_scales = Tensor::zeros(DType::i64, 50, 2);
  wide_scales[0].x_scales = i64_scales;
  CHECK_THROWS_WITH_AS(reference_dispatch(wide_scales, shape, 0),
                       doctest::Contains("float32 or int32"), Error);
  std::vector<DispatchInputs> mixed = f.views;
  Tensor packed = Tensor::zeros(DType::i32, 37, 2);
  mixed[2].x_scales = packed;
  CHECK_THROWS_WITH_AS(reference_dispatch(mixed, shape, 0),
                       doctest::Contains("all ranks must use one scale format"), Error);
  std::vector<DispatchInputs> ragged = f.views;
  Tensor three_cols = Tensor::zeros(DType::f32, 37, 3);
  ragged[2].x_scales = three_cols;
  CHECK_THROWS_WITH_AS(reference_dispatch(ragged, shape, 0),
                       doctest::Contains("x_scales must have shape [37, 2]"), Error);
}
