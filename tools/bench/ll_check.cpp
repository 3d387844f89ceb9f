#include "tools/bench/ll_check.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

constexpr const char* kPhase = "bench.ll";
constexpr int kDroppedEntries = 10;   // DeepEP's test: 10 random top-k entries set to -1
constexpr int kMarkedChannels = 128;  // the last 128 channels hold the token index

// Uniform in [0, 1) from the generator's raw 64-bit output (fixed by the standard).
double unit(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}

// |N(0, 1)| by Box-Muller; one draw per call is enough here.
float abs_normal(std::mt19937_64& gen) {
  double radius = std::sqrt(-2.0 * std::log(1.0 - unit(gen)));
  return static_cast<float>(std::abs(radius * std::cos(2.0 * std::numbers::pi * unit(gen))));
}

int64_t dispatch_message_bytes(int hidden, bool fp8) {
  return fp8 ? hidden + hidden / ep::kScaleBlock * 4 + 16 : 2 * int64_t{hidden} + 16;
}

LlTraffic compute_traffic(const ep::WorkloadOptions& options,
                          const std::vector<ep::RankInputs>& inputs) {
  const auto& shape = options.shape;
  const double dispatch_msg =
      static_cast<double>(dispatch_message_bytes(options.hidden, options.fp8));
  const double combine_msg = 2.0 * options.hidden;
  LlTraffic traffic;
  for (int r = 0; r < shape.num_ranks; ++r) {
    const auto& idx = inputs[r].topk_idx;
    double selections = 0, remote = 0;
    for (int64_t i = 0; i < idx.numel(); ++i) {
      int64_t expert = idx.data<int64_t>()[i];
      if (expert < 0) continue;
      ++selections;
      if (!shape.same_node(r, shape.rank_of_expert(expert))) ++remote;
    }
    traffic.selections.push_back(selections);
    traffic.remote_selections.push_back(remote);
    traffic.dispatch_bytes.push_back(selections * dispatch_msg);
    traffic.combine_bytes.push_back(selections * combine_msg);
    traffic.remote_dispatch_bytes.push_back(remote * dispatch_msg);
    traffic.remote_combine_bytes.push_back(remote * combine_msg);
  }
  return traffic;
}

}  // namespace

ep::RankInputs make_ll_inputs(const ep::WorkloadOptions& options, int rank) {
  // The routing of the workload generator's `random` mode is DeepEP's: top-k of |randn| + 1,
  // largest first. x and the weights are replaced below.
  ep::WorkloadOptions generator = options;
  generator.routing = ep::Routing::random;
  generator.drop_fraction = 0;
  generator.fp8 = false;
  generator.tokens_per_rank.clear();
  ep::RankInputs in = ep::make_rank_inputs(generator, rank);
  const int64_t tokens = in.x.rows(), hidden = options.hidden;
  auto* x = in.x.data<uint16_t>();
  const uint16_t rank_value = ep::float_to_bf16(static_cast<float>(rank - 128));
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t token_value = ep::float_to_bf16(static_cast<float>(t));
    for (int64_t c = 0; c < hidden; ++c)
      x[t * hidden + c] = c >= hidden - kMarkedChannels ? token_value : rank_value;
  }
  std::mt19937_64 gen(options.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) + 1);
  auto* idx = in.topk_idx.data<int64_t>();
  const auto entries = static_cast<uint64_t>(in.topk_idx.numel());
  for (int i = 0; i < kDroppedEntries; ++i)
    idx[gen() % entries] = -1;
  auto* weights = in.topk_weights.data<float>();
  for (int64_t i = 0; i < in.topk_weights.numel(); ++i)
    weights[i] = abs_normal(gen);
  if (options.fp8) ep::cast_to_fp8(in.x, in.x_fp8, in.x_scales);
  return in;
}

nlohmann::json LlTraffic::to_json(int nodes) const {
  nlohmann::json j = {{"selections_per_rank", selections},
                      {"dispatch_bytes_per_rank", dispatch_bytes},
                      {"combine_bytes_per_rank", combine_bytes}};
  if (nodes > 1) {
    j["remote_selections_per_rank"] = remote_selections;
    j["remote_dispatch_bytes_per_rank"] = remote_dispatch_bytes;
    j["remote_combine_bytes_per_rank"] = remote_combine_bytes;
  }
  return j;
}

void ll_dequantise_row(const std::byte* payload, const float* scales, int64_t scale_stride,
                       int64_t hidden, bool fp8, uint16_t* out) {
  if (!fp8) {
    std::memcpy(out, payload, static_cast<size_t>(hidden) * 2);
    return;
  }
  const auto* q = reinterpret_cast<const uint8_t*>(payload);
  for (int64_t g = 0; g < hidden / ep::kScaleBlock; ++g) {
    const float scale = scales[g * scale_stride];
    for (int64_t c = g * ep::kScaleBlock; c < (g + 1) * ep::kScaleBlock; ++c)
      out[c] = ep::float_to_bf16(ep::e4m3_to_float(q[c]) * scale);
  }
}

void ll_expert_output(const LlDispatchOutputs& d, int local_experts, ep::Tensor& out) {
  const int64_t rows = d.recv_x.rows, hidden = d.recv_x.cols;
  const bool fp8 = d.recv_x.dtype == ep::DType::fp8_e4m3;
  require(d.recv_x.contiguous() && local_experts > 0 && rows % local_experts == 0 &&
              (!fp8 || d.recv_x_scales.contiguous()),
          kPhase, "expert output: recv_x {} is not a contiguous [E_local * R*T, H] with E_local {}",
          d.recv_x.describe(), local_experts);
  if (!out.defined() || out.dtype() != ep::DType::bf16 || out.rows() != rows ||
      out.cols() != hidden)
    out = ep::Tensor::zeros(ep::DType::bf16, rows, hidden);
  const int64_t per_expert = rows / local_experts, groups = hidden / ep::kScaleBlock;
  const size_t row_bytes = static_cast<size_t>(hidden) * ep::dtype_size(d.recv_x.dtype);
  for (int e = 0; e < local_experts; ++e) {
    const int64_t count = d.recv_count.as<int32_t>()[e];
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = e * per_expert + i;
      const float* scales =
          fp8 ? d.recv_x_scales.as<float>() + e * groups * per_expert + i : nullptr;
      ll_dequantise_row(static_cast<const std::byte*>(d.recv_x.data) + row * row_bytes, scales,
                        per_expert, hidden, fp8, out.data<uint16_t>() + row * hidden);
    }
  }
}

LlReference::LlReference(const ep::WorkloadOptions& options) : options_(options) {
  for (int r = 0; r < options.shape.num_ranks; ++r)
    inputs_.push_back(make_ll_inputs(options, r));
  for (const auto& in : inputs_)
    views_.push_back({in.x, in.topk_idx, in.topk_weights});
  traffic_ = compute_traffic(options, inputs_);
}

ep::LlFormat LlReference::format() const {
  ep::LlFormat f;
  f.hidden = static_cast<uint32_t>(options_.hidden);
  f.fp8 = options_.fp8;
  return f;
}

std::string LlReference::check_dispatch(int rank, const LlDispatchOutputs& d) const {
  return ep::check_ll_dispatch(views_, options_.shape, options_.num_tokens, format(), rank, d);
}

std::string LlReference::check_combine(int rank, const ep::TensorRef& combined,
                                       double* diff) const {
  const auto& in = inputs_.at(rank);
  const int64_t tokens = in.x.rows(), hidden = options_.hidden;
  const int topk = options_.topk;
  if (combined.dtype != ep::DType::bf16 || combined.rows != tokens || combined.cols != hidden ||
      !combined.contiguous())
    return fmt::format("combined_x: got {}, expected contiguous bf16[{}, {}]", combined.describe(),
                       tokens, hidden);
  // DeepEP's calc_diff: 1 - 2 sum(x y) / sum(x^2 + y^2) over x + 1 and y + 1, in double.
  double cross = 0, squares = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    float weight = 0;
    for (int k = 0; k < topk; ++k)
      if (in.topk_idx.data<int64_t>()[t * topk + k] >= 0)
        weight += in.topk_weights.data<float>()[t * topk + k];
    for (int64_t c = 0; c < hidden; ++c) {
      const double got = ep::bf16_to_float(combined.as<uint16_t>()[t * hidden + c]);
      if (std::isnan(got)) return fmt::format("combined_x: NaN at token {} column {}", t, c);
      const double want = double(ep::bf16_to_float(in.x.data<uint16_t>()[t * hidden + c])) * weight;
      cross += (got + 1) * (want + 1);
      squares += (got + 1) * (got + 1) + (want + 1) * (want + 1);
    }
  }
  const double value = squares > 0 ? 1.0 - 2.0 * cross / squares : 0.0;
  if (diff) *diff = value;
  const double limit = options_.fp8 ? 9e-4 : 1e-5;
  if (!(value < limit))
    return fmt::format("combined_x: calc_diff against x * sum(weights) is {:.3g}, limit {:g}",
                       value, limit);
  // Exactly: every expert's output row of a token is its dispatch row dequantised, and the
  // dispatch rows are DeepEP LL's cast of the token (the dispatch check's reference).
  const auto f = format();
  std::vector<uint8_t> payload(f.payload_bytes());
  std::vector<uint32_t> scale_words(f.scale_words());
  ep::Tensor rows = ep::Tensor::empty(ep::DType::bf16, tokens, hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    ep::ll_cast_reference(f, in.x.data<uint16_t>() + t * hidden, payload.data(),
                          scale_words.data());
    ll_dequantise_row(reinterpret_cast<const std::byte*>(payload.data()),
                      reinterpret_cast<const float*>(scale_words.data()), 1, hidden, f.fp8,
                      rows.data<uint16_t>() + t * hidden);
  }
  ep::Tensor want = ep::reference_ll_combine(
      in.topk_idx, in.topk_weights, f.hidden, rank,
      [&](int64_t, int, int64_t t) { return rows.data<uint16_t>() + t * hidden; });
  const auto* got_bits = combined.as<uint16_t>();
  for (int64_t i = 0; i < tokens * hidden; ++i)
    if (got_bits[i] != want.data<uint16_t>()[i])
      return fmt::format("combined_x: token {} column {}: {} differs from the reference's {}",
                         i / hidden, i % hidden, ep::bf16_to_float(got_bits[i]),
                         ep::bf16_to_float(want.data<uint16_t>()[i]));
  return "";
}

}  // namespace proxyep::tools
