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

// The low-latency outputs' forms, before any element is read.
std::string check_forms(const LlDispatchOutputs& d, const ep::WorkloadOptions& o) {
  const auto& s = o.shape;
  const int64_t local = s.experts_per_rank(), slots = int64_t{s.num_ranks} * o.num_tokens;
  auto form = [](const ep::TensorRef& t, ep::DType dtype, int64_t numel, const char* name,
                 const std::string& want) -> std::string {
    if (t.dtype == dtype && t.numel() == numel && t.contiguous()) return "";
    return fmt::format("{}: got {}, expected contiguous {}", name, t.describe(), want);
  };
  std::string diff = form(
      d.recv_x, o.fp8 ? ep::DType::fp8_e4m3 : ep::DType::bf16, local * slots * o.hidden, "recv_x",
      fmt::format("{}[{}, {}]", o.fp8 ? "fp8_e4m3" : "bf16", local * slots, o.hidden));
  if (diff.empty() && o.fp8) {
    const int64_t groups = o.hidden / ep::kScaleBlock;
    diff = form(d.recv_x_scales, ep::DType::f32, local * groups * slots, "recv_x_scales",
                fmt::format("f32[{}, {}]", local * groups, slots));
  }
  if (diff.empty())
    diff = form(d.recv_count, ep::DType::i32, local, "recv_count", fmt::format("i32[{}]", local));
  if (diff.empty())
    diff = form(d.src_info, ep::DType::i32, local * slots, "src_info",
                fmt::format("i32[{}, {}]", local, slots));
  if (diff.empty())
    diff = form(d.layout_range, ep::DType::i64, local * s.num_ranks, "layout_range",
                fmt::format("i64[{}, {}]", local, s.num_ranks));
  return diff;
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

void ll_expert_output(const LlDispatchOutputs& d, int local_experts, ep::Tensor& out) {
  const int64_t rows = d.recv_x.rows, hidden = d.recv_x.cols;
  require(d.recv_x.col_stride == 1 && local_experts > 0 && rows % local_experts == 0, kPhase,
          "expert output: recv_x {} is not [E_local * R*T, H] with E_local {}", d.recv_x.describe(),
          local_experts);
  if (!out.defined() || out.dtype() != ep::DType::bf16 || out.rows() != rows ||
      out.cols() != hidden)
    out = ep::Tensor::zeros(ep::DType::bf16, rows, hidden);
  const bool fp8 = d.recv_x.dtype == ep::DType::fp8_e4m3;
  const int64_t per_expert = rows / local_experts, groups = hidden / ep::kScaleBlock;
  auto* dst = out.data<uint16_t>();
  for (int e = 0; e < local_experts; ++e) {
    const int64_t count = d.recv_count.as<int32_t>()[e];
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = e * per_expert + i;
      const auto* src = static_cast<const std::byte*>(d.recv_x.data) +
                        row * d.recv_x.row_stride * ep::dtype_size(d.recv_x.dtype);
      if (!fp8) {
        std::memcpy(dst + row * hidden, src, static_cast<size_t>(hidden) * 2);
        continue;
      }
      const auto* q = reinterpret_cast<const uint8_t*>(src);
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = d.recv_x_scales.at<float>(e * groups + g, i);
        for (int64_t c = g * ep::kScaleBlock; c < (g + 1) * ep::kScaleBlock; ++c)
          dst[row * hidden + c] = ep::float_to_bf16(ep::e4m3_to_float(q[c]) * scale);
      }
    }
  }
}

LlReference::LlReference(const ep::WorkloadOptions& options) : options_(options) {
  for (int r = 0; r < options.shape.num_ranks; ++r)
    inputs_.push_back(make_ll_inputs(options, r));
  traffic_ = compute_traffic(options, inputs_);
}

std::string LlReference::check_dispatch(int rank, const LlDispatchOutputs& d) const {
  const auto& o = options_;
  const auto& s = o.shape;
  if (std::string diff = check_forms(d, o); !diff.empty()) return diff;
  const int local = s.experts_per_rank(), ranks = s.num_ranks, topk = o.topk;
  const int64_t slots = int64_t{ranks} * o.num_tokens, hidden = o.hidden;
  const int64_t groups = hidden / ep::kScaleBlock;
  // want[e][s]: the tokens of rank s that selected local expert e, ascending.
  std::vector<std::vector<std::vector<int32_t>>> want(
      static_cast<size_t>(local), std::vector<std::vector<int32_t>>(static_cast<size_t>(ranks)));
  for (int src = 0; src < ranks; ++src) {
    const auto& idx = inputs_[src].topk_idx;
    for (int64_t t = 0; t < idx.rows(); ++t)
      for (int k = 0; k < topk; ++k) {
        int64_t e = s.local_expert(idx.data<int64_t>()[t * topk + k], rank);
        if (e >= 0) want[e][src].push_back(static_cast<int32_t>(t));
      }
  }
  const auto* counts = d.recv_count.as<int32_t>();
  const auto* src_info = d.src_info.as<int32_t>();
  const auto* ranges = d.layout_range.as<int64_t>();
  for (int e = 0; e < local; ++e) {
    int64_t expected = 0;
    for (const auto& tokens : want[e])
      expected += static_cast<int64_t>(tokens.size());
    if (counts[e] != expected)
      return fmt::format("recv_count[{}] = {}, expected {}", e, counts[e], expected);
    std::vector<uint8_t> covered(static_cast<size_t>(expected), 0);
    for (int src = 0; src < ranks; ++src) {
      const auto range = static_cast<uint64_t>(ranges[e * ranks + src]);
      const int64_t begin = static_cast<int64_t>(range >> 32), count = range & 0xffffffffu;
      if (count != static_cast<int64_t>(want[e][src].size()))
        return fmt::format("layout_range[{}][{}]: count {}, expected {}", e, src, count,
                           want[e][src].size());
      if (count == 0) continue;
      if (begin + count > expected)
        return fmt::format("layout_range[{}][{}]: rows [{}, {}) pass recv_count {}", e, src, begin,
                           begin + count, expected);
      std::vector<int32_t> got;
      for (int64_t i = begin; i < begin + count; ++i) {
        if (covered[i]) return fmt::format("expert {}: row {} is in two source blocks", e, i);
        covered[i] = 1;
        const int32_t t = src_info[e * slots + i];
        if (t < 0 || t >= inputs_[src].x.rows())
          return fmt::format("src_info[{}][{}] = {} is no token of rank {}", e, i, t, src);
        got.push_back(t);
        const uint16_t* x = inputs_[src].x.data<uint16_t>() + int64_t{t} * hidden;
        const int64_t row = e * slots + i;
        if (!o.fp8) {
          if (std::memcmp(d.recv_x.as<uint16_t>() + row * hidden, x,
                          static_cast<size_t>(hidden) * 2) != 0)
            return fmt::format("recv_x: expert {} row {} differs from rank {}'s token {}", e, i,
                               src, t);
          continue;
        }
        const uint8_t* q = d.recv_x.as<uint8_t>() + row * hidden;
        for (int64_t c = 0; c < hidden; ++c) {
          const float scale = d.recv_x_scales.at<float>(e * groups + c / ep::kScaleBlock, i);
          const float got_value = ep::e4m3_to_float(q[c]) * scale;
          const float want_value = ep::bf16_to_float(x[c]);
          // e4m3 keeps 3 mantissa bits (relative rounding <= 2^-4); subnormals step by 2^-9.
          const float tolerance = std::abs(want_value) * 0.0625f + scale * (1.0f / 512.0f);
          if (!(std::abs(got_value - want_value) <= tolerance))
            return fmt::format(
                "recv_x: expert {} row {} (rank {} token {}) column {}: dequantised {}, "
                "expected {}",
                e, i, src, t, c, got_value, want_value);
        }
      }
      std::sort(got.begin(), got.end());
      if (got != want[e][src])
        return fmt::format(
            "expert {}: the block of rank {} holds other tokens than those that selected it", e,
            src);
    }
  }
  return "";
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
  return "";
}

}  // namespace proxyep::tools
