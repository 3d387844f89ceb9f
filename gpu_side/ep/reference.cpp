// The reference is deliberately the obvious loop over (source rank, token): any cleverness here
// would make it a second implementation to debug rather than a specification to compare against.
// Inputs are checked first, with the phase "reference", so a malformed test fails with a message
// instead of reading out of bounds.
#include "gpu_side/ep/reference.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::gpu_side::ep {

namespace {

constexpr std::string_view kPhase = "reference";

// Copies row `row` of a (possibly strided) view to contiguous `out`.
void copy_row(const TensorRef& source, int64_t row, std::byte* out) {
  const size_t element = dtype_size(source.dtype);
  const auto* base = static_cast<const std::byte*>(source.data);
  if (source.col_stride == 1 || source.cols == 1) {
    std::memcpy(out, base + static_cast<size_t>(row * source.row_stride) * element,
                static_cast<size_t>(source.cols) * element);
    return;
  }
  for (int64_t c = 0; c < source.cols; ++c)
    std::memcpy(
        out + static_cast<size_t>(c) * element,
        base + static_cast<size_t>(row * source.row_stride + c * source.col_stride) * element,
        element);
}

using InputForm = DispatchInputForm;

// Rank 0's scales fix the form every rank's scales must have.
void read_scale_form(const TensorRef& scales, InputForm& form) {
  require_defined(scales, kPhase, "x_scales (float8_e4m3fn x)");
  require(scales.dtype == DType::f32 || scales.dtype == DType::i32, kPhase,
          "x_scales must be float32 or int32 (packed UE8M0); got {}", scales.describe());
  require(scales.dims == 2 && scales.cols >= 1, kPhase,
          "x_scales must be 2-D [num_tokens, num_scales] with num_scales >= 1; got {}",
          scales.describe());
  form.scale_dtype = scales.dtype;
  form.scale_cols = scales.cols;
}

void check_scales(const TensorRef& scales, const InputForm& form, size_t rank, int64_t tokens) {
  require_defined(scales, kPhase, "x_scales (float8_e4m3fn x)");
  require(scales.dtype == form.scale_dtype, kPhase,
          "x_scales of rank {} is {}; rank 0's is {} (all ranks must use one scale format)", rank,
          scales.describe(), dtype_name(form.scale_dtype));
  require_host(scales, kPhase, "x_scales");
  require_shape(scales, tokens, form.scale_cols, kPhase, "x_scales");
}

// The first source's form: what every other source's inputs must match.
InputForm read_form(const DispatchInputs& first) {
  InputForm form;
  form.hidden = first.x.cols;
  form.topk = static_cast<int>(first.topk_idx.cols);
  form.x_dtype = first.x.dtype;
  form.weights = first.topk_weights.defined();
  require(form.x_dtype == DType::bf16 || form.x_dtype == DType::fp8_e4m3, kPhase,
          "x must be bf16 or float8_e4m3fn; got {}", first.x.describe());
  if (form.x_dtype == DType::fp8_e4m3) read_scale_form(first.x_scales, form);
  return form;
}

// Checks source `r`'s inputs against the form (same hidden, top-k, dtype, weights given).
void check_source(const DispatchInputs& in, const InputForm& form, int r, const EpShape& shape) {
  validate_topk_idx(in.topk_idx, shape, kPhase);
  const int64_t tokens = in.topk_idx.rows;
  require_dtype(in.x, form.x_dtype, kPhase, "x");
  require_host(in.x, kPhase, "x");
  require_shape(in.x, tokens, form.hidden, kPhase, "x");
  require(in.topk_idx.cols == form.topk, kPhase, "rank {} has num_topk {}; rank 0 has {}", r,
          in.topk_idx.cols, form.topk);
  if (form.x_dtype == DType::fp8_e4m3) check_scales(in.x_scales, form, size_t(r), tokens);
  require(in.topk_weights.defined() == form.weights, kPhase,
          "topk_weights must be given for all ranks or none (rank {} differs from rank 0)", r);
  if (form.weights) {
    require_dtype(in.topk_weights, DType::f32, kPhase, "topk_weights");
    require_host(in.topk_weights, kPhase, "topk_weights");
    require_shape(in.topk_weights, tokens, form.topk, kPhase, "topk_weights");
  }
}

// Checks combine's inputs against each other: one entry per rank, shapes that match each rank's
// dispatch result, bf16 expert outputs and biases, f32 weights.
void check_combine_inputs(std::span<const TensorRef> expert_out,
                          std::span<const ReferenceDispatch> dispatched,
                          std::span<const TensorRef> weights_in, const EpShape& shape, int rank,
                          int num_tokens, const TensorRef& bias0, const TensorRef& bias1) {
  const int ranks = shape.num_ranks;
  require(rank >= 0 && rank < ranks, kPhase, "rank {} is outside [0, {})", rank, ranks);
  require(num_tokens >= 0, kPhase, "num_tokens must be >= 0; got {}", num_tokens);
  require(expert_out.size() == size_t(ranks) && dispatched.size() == size_t(ranks), kPhase,
          "expert_out ({}) and dispatched ({}) must hold one entry per rank ({})",
          expert_out.size(), dispatched.size(), ranks);
  require(weights_in.empty() || weights_in.size() == size_t(ranks), kPhase,
          "weights_in must be empty or hold one entry per rank; got {}", weights_in.size());
  require_defined(expert_out[0], kPhase, "expert_out[0]");
  const int64_t hidden = expert_out[0].cols;
  const bool weights = !weights_in.empty();
  const int64_t topk = weights ? weights_in[0].cols : 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t recv = dispatched[r].recv_src_idx.rows();
    require(dispatched[r].recv_from.size() == size_t(ranks), kPhase,
            "dispatched[{}].recv_from has {} entries; expected {}", r,
            dispatched[r].recv_from.size(), ranks);
    require_dtype(expert_out[r], DType::bf16, kPhase, "expert_out");
    require_host(expert_out[r], kPhase, "expert_out");
    require_shape(expert_out[r], recv, hidden, kPhase, "expert_out");
    if (weights) {
      require_dtype(weights_in[r], DType::f32, kPhase, "weights_in");
      require_host(weights_in[r], kPhase, "weights_in");
      require_shape(weights_in[r], recv, topk, kPhase, "weights_in");
    }
  }
  for (const TensorRef* bias : {&bias0, &bias1}) {
    if (!bias->defined()) continue;
    require_dtype(*bias, DType::bf16, kPhase, "bias");
    require_host(*bias, kPhase, "bias");
    require_shape(*bias, num_tokens, hidden, kPhase, "bias");
  }
}

// The rows [first, end) of dispatched[r]'s receive order that came from `rank` (its receive
// order groups rows by source rank).
struct RowsFrom {
  int64_t first = 0;
  int64_t end = 0;
};
RowsFrom rows_from(const ReferenceDispatch& d, int r, int rank) {
  RowsFrom rows;
  for (int s = 0; s < rank; ++s)
    rows.first += d.recv_from[s];
  rows.end = rows.first + d.recv_from[rank];
  require(rows.end <= d.recv_src_idx.rows(), kPhase,
          "dispatched[{}].recv_from sums past its {} received rows", r, d.recv_src_idx.rows());
  return rows;
}

// The source token of dispatched[r]'s received row i, checked against the source's tokens.
int64_t source_token(const ReferenceDispatch& d, int r, int64_t i, int64_t num_tokens) {
  const int64_t t = d.recv_src_idx.data<int32_t>()[i];
  require(t >= 0 && t < num_tokens, kPhase, "dispatched[{}] row {} names token {} outside [0, {})",
          r, i, t, num_tokens);
  return t;
}

float bias_at(const TensorRef& bias, int64_t t, int64_t c) {
  return bias.defined() ? bf16_to_float(bias.at<uint16_t>(t, c)) : 0.0f;
}

// CombineOrder::by_topk, from its definition (top of reference.hpp): each token's returned rows,
// sorted by the last lane each rank owns, added to bias0 + bias1; weights picked by owner.
ReferenceCombine combine_by_topk(std::span<const TensorRef> expert_out,
                                 std::span<const ReferenceDispatch> dispatched,
                                 std::span<const TensorRef> weights_in, int rank, int num_tokens,
                                 const TensorRef& bias0, const TensorRef& bias1) {
  const int64_t hidden = expert_out[0].cols;
  const bool weights = !weights_in.empty();
  const int64_t topk = weights ? weights_in[0].cols : 0;
  struct Returned {
    int last_lane;
    int rank;
    int64_t row;
  };
  std::vector<std::vector<Returned>> returned(static_cast<size_t>(num_tokens));
  for (int r = 0; r < static_cast<int>(dispatched.size()); ++r) {
    const ReferenceDispatch& d = dispatched[r];
    require(d.recv_topk_idx.defined() && d.recv_topk_idx.rows() == d.recv_src_idx.rows() &&
                (!weights || d.recv_topk_idx.cols() == topk),
            kPhase, "by_topk needs dispatched[{}].recv_topk_idx, one row per received token{}", r,
            weights ? " and as many lanes as weights_in" : "");
    const int64_t lanes = d.recv_topk_idx.cols();
    const RowsFrom rows = rows_from(d, r, rank);
    for (int64_t i = rows.first; i < rows.end; ++i) {
      const int64_t t = source_token(d, r, i, num_tokens);
      int last = -1;
      for (int64_t k = 0; k < lanes; ++k)
        if (d.recv_topk_idx.data<int64_t>()[i * lanes + k] >= 0) last = static_cast<int>(k);
      require(last >= 0, kPhase, "dispatched[{}] row {} has no local lane to order it by", r, i);
      returned[static_cast<size_t>(t)].push_back({last, r, i});
    }
  }

  ReferenceCombine out;
  out.combined_x = Tensor::empty(DType::bf16, num_tokens, hidden);
  if (weights) out.combined_topk_weights = Tensor::zeros(DType::f32, num_tokens, topk);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<Returned>& parts = returned[static_cast<size_t>(t)];
    std::sort(parts.begin(), parts.end(),
              [](const Returned& a, const Returned& b) { return a.last_lane < b.last_lane; });
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = bias_at(bias0, t, c) + bias_at(bias1, t, c);
      for (const Returned& p : parts)
        acc += bf16_to_float(expert_out[p.rank].at<uint16_t>(p.row, c));
      out.combined_x.data<uint16_t>()[t * hidden + c] = float_to_bf16(acc);
    }
    for (int64_t k = 0; k < topk; ++k)
      for (const Returned& p : parts)
        if (dispatched[p.rank].recv_topk_idx.data<int64_t>()[p.row * topk + k] >= 0)
          out.combined_topk_weights.data<float>()[t * topk + k] =
              weights_in[p.rank].at<float>(p.row, k);
  }
  return out;
}

}  // namespace

ReferenceReceiver::ReferenceReceiver(const EpShape& shape, int rank, int expert_alignment)
    : shape_(shape), rank_(rank), expert_alignment_(expert_alignment) {
  require(rank >= 0 && rank < shape.num_ranks, kPhase, "rank {} is outside [0, {})", rank,
          shape.num_ranks);
  require(expert_alignment >= 1, kPhase, "expert_alignment must be >= 1; got {}", expert_alignment);
  recv_from_.assign(static_cast<size_t>(shape.num_ranks), 0);
  expert_pairs_.assign(static_cast<size_t>(shape.experts_per_rank()), 0);
}

void ReferenceReceiver::add_source(int source, const DispatchInputs& in) {
  require(source >= next_source_ && source < shape_.num_ranks, kPhase,
          "sources must come in ascending order inside [0, {}), each once; got {} after {}",
          shape_.num_ranks, source, next_source_ - 1);
  if (!have_form_) form_ = read_form(in);
  have_form_ = true;
  check_source(in, form_, source, shape_);
  next_source_ = source + 1;
  const int topk = form_.topk;
  const bool fp8 = form_.x_dtype == DType::fp8_e4m3;
  const size_t row_bytes = static_cast<size_t>(form_.hidden) * dtype_size(form_.x_dtype);
  const size_t scale_row_bytes =
      static_cast<size_t>(form_.scale_cols) * dtype_size(form_.scale_dtype);
  const auto* idx = in.topk_idx.as<int64_t>();
  for (int64_t t = 0; t < in.topk_idx.rows; ++t) {
    bool hit = false;
    for (int k = 0; k < topk && !hit; ++k)
      hit = shape_.local_expert(idx[t * topk + k], rank_) >= 0;
    if (!hit) continue;
    ++recv_from_[static_cast<size_t>(source)];
    x_.resize(x_.size() + row_bytes);
    copy_row(in.x, t, x_.data() + x_.size() - row_bytes);
    if (fp8) {
      scales_.resize(scales_.size() + scale_row_bytes);
      copy_row(in.x_scales, t, scales_.data() + scales_.size() - scale_row_bytes);
    }
    src_idx_.push_back(static_cast<int32_t>(t));
    for (int k = 0; k < topk; ++k) {
      const int64_t local = shape_.local_expert(idx[t * topk + k], rank_);
      topk_idx_.push_back(local);
      if (local >= 0) ++expert_pairs_[static_cast<size_t>(local)];
      if (form_.weights)
        topk_weights_.push_back(local >= 0 ? in.topk_weights.at<float>(t, k) : 0.0f);
    }
  }
}

ReferenceDispatch ReferenceReceiver::finish() {
  ReferenceDispatch out;
  const auto num_recv = static_cast<int64_t>(src_idx_.size());
  auto fill = [](Tensor tensor, const void* bytes, size_t size) {
    if (size > 0) std::memcpy(tensor.raw(), bytes, size);
    return tensor;
  };
  out.recv_x = fill(Tensor::empty(form_.x_dtype, num_recv, form_.hidden), x_.data(), x_.size());
  if (form_.x_dtype == DType::fp8_e4m3)
    out.recv_x_scales = fill(Tensor::empty(form_.scale_dtype, num_recv, form_.scale_cols),
                             scales_.data(), scales_.size());
  out.recv_topk_idx = fill(Tensor::empty(DType::i64, num_recv, form_.topk), topk_idx_.data(),
                           topk_idx_.size() * sizeof(int64_t));
  if (form_.weights)
    out.recv_topk_weights = fill(Tensor::empty(DType::f32, num_recv, form_.topk),
                                 topk_weights_.data(), topk_weights_.size() * sizeof(float));
  out.recv_src_idx =
      fill(Tensor::empty(DType::i32, num_recv), src_idx_.data(), src_idx_.size() * sizeof(int32_t));
  out.recv_from = std::move(recv_from_);
  for (int64_t count : expert_pairs_) {
    const int64_t aligned = (count + expert_alignment_ - 1) / expert_alignment_ * expert_alignment_;
    out.num_recv_tokens_per_expert.push_back(static_cast<int>(aligned));
  }
  *this = ReferenceReceiver(shape_, rank_, expert_alignment_);
  return out;
}

ReferenceDispatch reference_dispatch(std::span<const DispatchInputs> all, const EpShape& shape,
                                     int rank, int expert_alignment) {
  ReferenceReceiver receiver(shape, rank, expert_alignment);
  require(all.size() == size_t(shape.num_ranks), kPhase, "got inputs of {} ranks; expected {}",
          all.size(), shape.num_ranks);
  for (int source = 0; source < shape.num_ranks; ++source)
    receiver.add_source(source, all[static_cast<size_t>(source)]);
  return receiver.finish();
}

ReferenceCombine reference_combine(std::span<const TensorRef> expert_out,
                                   std::span<const ReferenceDispatch> dispatched,
                                   std::span<const TensorRef> weights_in, const EpShape& shape,
                                   int rank, int num_tokens, const TensorRef& bias0,
                                   const TensorRef& bias1, CombineOrder order) {
  check_combine_inputs(expert_out, dispatched, weights_in, shape, rank, num_tokens, bias0, bias1);
  if (order == CombineOrder::by_topk)
    return combine_by_topk(expert_out, dispatched, weights_in, rank, num_tokens, bias0, bias1);
  const int ranks = shape.num_ranks;
  const int64_t hidden = expert_out[0].cols;
  const bool weights = !weights_in.empty();
  const int64_t topk = weights ? weights_in[0].cols : 0;
  const auto cells = static_cast<size_t>(num_tokens * hidden);
  const auto weight_cells = static_cast<size_t>(num_tokens * topk);

  // Accumulate in float32 from a 0.0f start, like the kernels' zeroed accumulators. by_rank: one
  // group holding every rank, ascending, then the biases. by_node: a group per node (ranks
  // ascending), whose sum is rounded to bf16 and added, nodes ascending, to a total that starts
  // as bias0 + bias1.
  const bool by_node = order == CombineOrder::by_node;
  std::vector<float> sum(cells, 0.0f), weight_sum(weight_cells, 0.0f);
  if (by_node)
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t c = 0; c < hidden; ++c)
        sum[static_cast<size_t>(t * hidden + c)] = bias_at(bias0, t, c) + bias_at(bias1, t, c);
  std::vector<float> node_sum(cells, 0.0f), node_weight_sum(weight_cells, 0.0f);
  std::vector<char> node_hit(static_cast<size_t>(num_tokens), 0);
  const int group = by_node ? shape.ranks_per_node : ranks;
  auto close_group = [&] {
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (!node_hit[static_cast<size_t>(t)]) continue;
      for (int64_t c = 0; c < hidden; ++c) {
        float& partial = node_sum[static_cast<size_t>(t * hidden + c)];
        sum[static_cast<size_t>(t * hidden + c)] +=
            by_node ? bf16_to_float(float_to_bf16(partial)) : partial;
        partial = 0.0f;
      }
      for (int64_t k = 0; k < topk; ++k) {
        float& partial = node_weight_sum[static_cast<size_t>(t * topk + k)];
        weight_sum[static_cast<size_t>(t * topk + k)] += partial;
        partial = 0.0f;
      }
      node_hit[static_cast<size_t>(t)] = 0;
    }
  };
  for (int r = 0; r < ranks; ++r) {
    const ReferenceDispatch& d = dispatched[r];
    const RowsFrom rows = rows_from(d, r, rank);
    for (int64_t i = rows.first; i < rows.end; ++i) {
      const int64_t t = source_token(d, r, i, num_tokens);
      node_hit[static_cast<size_t>(t)] = 1;
      for (int64_t c = 0; c < hidden; ++c)
        node_sum[static_cast<size_t>(t * hidden + c)] +=
            bf16_to_float(expert_out[r].at<uint16_t>(i, c));
      for (int64_t k = 0; k < topk; ++k)
        node_weight_sum[static_cast<size_t>(t * topk + k)] += weights_in[r].at<float>(i, k);
    }
    if ((r + 1) % group == 0 || r + 1 == ranks) close_group();
  }

  ReferenceCombine out;
  out.combined_x = Tensor::empty(DType::bf16, num_tokens, hidden);
  uint16_t* x = out.combined_x.data<uint16_t>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      float value = sum[static_cast<size_t>(t * hidden + c)];
      if (!by_node && bias0.defined()) value += bf16_to_float(bias0.at<uint16_t>(t, c));
      if (!by_node && bias1.defined()) value += bf16_to_float(bias1.at<uint16_t>(t, c));
      x[t * hidden + c] = float_to_bf16(value);
    }
  }
  if (weights) {
    out.combined_topk_weights = Tensor::empty(DType::f32, num_tokens, topk);
    std::copy(weight_sum.begin(), weight_sum.end(), out.combined_topk_weights.data<float>());
  }
  return out;
}

}  // namespace proxyep::gpu_side::ep
