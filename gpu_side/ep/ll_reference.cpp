// The LL reference is deliberately plain and shares no arithmetic with ll_rules.hpp: float
// operations are done in double and rounded to float once (for + - * / that equals the float
// operation exactly, since double has more than 2 * 24 + 2 bits), powers of two come from
// frexp/ldexp, and e4m3 codes from a search over the 127 finite magnitudes.
#include "gpu_side/ep/ll_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

namespace proxyep::gpu_side::ep {

namespace {

float from_bf16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest, ties to even, by looking at the 16 dropped bits. Inputs here are finite.
uint16_t to_bf16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  auto kept = static_cast<uint16_t>(bits >> 16);
  const uint32_t dropped = bits & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u) != 0)) ++kept;
  return kept;
}

// The 127 non-negative finite e4m3 magnitudes, indexed by code (0x00..0x7e), increasing.
const std::array<double, 127>& e4m3_magnitudes() {
  static const std::array<double, 127> table = [] {
    std::array<double, 127> t{};
    for (int code = 0; code < 127; ++code) {
      const int exponent = code >> 3, mantissa = code & 7;
      t[code] = exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
    }
    return t;
  }();
  return table;
}

// Nearest e4m3 code, ties to the even code, saturating at 448 (__NV_SATFINITE).
uint8_t to_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(static_cast<double>(value));
  const auto& table = e4m3_magnitudes();
  const auto above = std::lower_bound(table.begin(), table.end(), magnitude);
  if (above == table.end()) return sign | 0x7e;
  auto code = static_cast<int>(above - table.begin());
  if (code > 0 && *above != magnitude) {
    const double up = *above - magnitude, down = magnitude - table[code - 1];
    if (down < up || (down == up && ((code - 1) & 1) == 0)) --code;
  }
  return static_cast<uint8_t>(sign | code);
}

float mul(float a, float b) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b));
}

}  // namespace

void ll_cast_reference(const LlFormat& f, const uint16_t* x, uint8_t* payload,
                       uint32_t* scale_words) {
  const int64_t hidden = f.hidden;
  if (!f.fp8) {
    std::memcpy(payload, x, static_cast<size_t>(hidden) * 2);
    return;
  }
  const float floor = static_cast<float>(1e-4);  // DeepEP's kFP8Margin
  const float inv_max = 1.0f / 448.0f;           // DeepEP's kFinfoAmaxInvE4M3
  std::fill_n(scale_words, f.scale_words(), 0u);
  for (int64_t g = 0; g < hidden / 128; ++g) {
    float amax = floor;
    for (int64_t c = g * 128; c < (g + 1) * 128; ++c)
      amax = std::max(amax, std::fabs(from_bf16(x[c])));
    float scale = 0, scale_inv = 0;
    int exponent = 0;  // round_scale: scale_inv = 2^exponent
    if (f.round_scale) {
      int e2 = 0;
      const double m = std::frexp(mul(amax, inv_max), &e2);  // ratio = m * 2^e2, m in [0.5, 1)
      exponent = m == 0.5 ? e2 - 1 : e2;                     // ceil(log2(ratio))
      scale_inv = std::ldexp(1.0f, exponent);
      scale = std::ldexp(1.0f, -exponent);
    } else {
      scale_inv = mul(amax, inv_max);
      scale = static_cast<float>(448.0 / static_cast<double>(amax));
    }
    for (int64_t c = g * 128; c < (g + 1) * 128; ++c)
      payload[c] = to_e4m3(mul(from_bf16(x[c]), scale));
    if (f.ue8m0)
      scale_words[g / 4] |= static_cast<uint32_t>(exponent + 127) << (8 * (g % 4));
    else
      scale_words[g] = std::bit_cast<uint32_t>(scale_inv);
  }
}

namespace {

// The views check_ll_dispatch reads, with their shapes checked; "" when fine.
std::string view_error(const TensorRef& t, const char* name, std::initializer_list<DType> dtypes,
                       int64_t rows, int64_t cols) {
  if (!t.defined() || t.data == nullptr) return fmt::format("{} is missing", name);
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end() || t.rows != rows ||
      t.cols != cols)
    return fmt::format("{} must be [{}, {}] of the right dtype; got {}", name, rows, cols,
                       t.describe());
  return {};
}

struct Checker {
  std::span<const LlRankInputs> all;
  const EpShape& shape;
  int64_t max_tokens;
  const LlFormat& f;
  int rank;
  const LlDispatchOutputs& out;
  int64_t rows_per_expert = 0;  // R * T
  // The reference message body (payload, then scale words) of each (source, token), made once.
  std::vector<std::vector<std::optional<std::vector<uint8_t>>>> casts;

  const std::vector<uint8_t>& cast(int src, int64_t token) {
    auto& slot = casts[src][token];
    if (!slot) {
      std::vector<uint8_t> body(f.payload_bytes() + 4 * size_t{f.scale_words()});
      std::vector<uint32_t> words(f.scale_words());
      ll_cast_reference(f, all[src].x.as<uint16_t>() + token * all[src].x.row_stride, body.data(),
                        words.data());
      std::memcpy(body.data() + f.payload_bytes(), words.data(), 4 * words.size());
      slot = std::move(body);
    }
    return *slot;
  }

  std::string inputs_error() const {
    for (int s = 0; s < shape.num_ranks; ++s) {
      const LlRankInputs& in = all[s];
      const int64_t n = in.x.rows;
      if (n > max_tokens)
        return fmt::format("rank {} has {} tokens, more than {}", s, n, max_tokens);
      std::string why = view_error(in.x, "x", {DType::bf16}, n, f.hidden);
      if (why.empty()) why = view_error(in.topk_idx, "topk_idx", {DType::i64}, n, in.topk_idx.cols);
      if (!why.empty()) return fmt::format("rank {}: {}", s, why);
      if (in.x.col_stride != 1) return fmt::format("rank {}: x must have unit column stride", s);
    }
    return {};
  }

  std::string outputs_error() const {
    const int64_t experts = shape.experts_per_rank();
    // One element per channel: e4m3 (or its bytes as u8) or bf16.
    std::string why = f.fp8 ? view_error(out.recv_x, "recv_x", {DType::fp8_e4m3, DType::u8},
                                         experts * rows_per_expert, f.hidden)
                            : view_error(out.recv_x, "recv_x", {DType::bf16},
                                         experts * rows_per_expert, f.hidden);
    if (why.empty() && out.recv_x.col_stride != 1) why = "recv_x must have unit column stride";
    if (why.empty() && f.fp8)
      why = view_error(out.recv_x_scales, "recv_x_scales", {DType::f32, DType::i32},
                       experts * f.scale_words(), rows_per_expert);
    if (why.empty()) why = view_error(out.recv_count, "recv_count", {DType::i32}, experts, 1);
    if (why.empty())
      why = view_error(out.src_info, "src_info", {DType::i32}, experts, rows_per_expert);
    if (why.empty())
      why = view_error(out.layout_range, "layout_range", {DType::i64}, experts, shape.num_ranks);
    return why;
  }

  // Expert e (local) of this rank, tokens from source s: begin/count of the block checked.
  std::string block_error(int64_t e, int s, int64_t begin, int64_t count) {
    const LlRankInputs& in = all[s];
    const int64_t global = static_cast<int64_t>(rank) * shape.experts_per_rank() + e;
    // How often each of s's tokens chose the expert (once per k, as DeepEP counts).
    std::vector<int> wanted(static_cast<size_t>(in.x.rows), 0);
    int64_t expected = 0;
    for (int64_t t = 0; t < in.topk_idx.rows; ++t)
      for (int64_t k = 0; k < in.topk_idx.cols; ++k)
        if (in.topk_idx.at<int64_t>(t, k) == global) ++wanted[t], ++expected;
    if (count != expected)
      return fmt::format("expert {}, source rank {}: layout_range count {}, expected {}", e, s,
                         count, expected);
    const auto* x_base = static_cast<const std::byte*>(out.recv_x.data);
    const size_t x_row_bytes = out.recv_x.row_stride * dtype_size(out.recv_x.dtype);
    for (int64_t i = begin; i < begin + count; ++i) {
      const int64_t token = out.src_info.at<int32_t>(e, i);
      const auto where = [&] { return fmt::format("expert {}, source rank {}, row {}", e, s, i); };
      if (token < 0 || token >= in.x.rows || wanted[token] == 0)
        return fmt::format(
            "{}: src_info {} is not a token of that source choosing the expert "
            "(or appears too often)",
            where(), token);
      --wanted[token];
      const std::vector<uint8_t>& body = cast(s, token);
      const std::byte* row = x_base + (e * rows_per_expert + i) * x_row_bytes;
      if (std::memcmp(row, body.data(), f.payload_bytes()) != 0)
        return fmt::format("{}: payload differs from the cast of token {}", where(), token);
      for (uint32_t w = 0; w < f.scale_words(); ++w) {
        const uint32_t got = out.recv_x_scales.at<uint32_t>(e * f.scale_words() + w, i);
        uint32_t want = 0;
        std::memcpy(&want, body.data() + f.payload_bytes() + 4 * w, 4);
        if (got != want)
          return fmt::format("{}: scale word {} is {:#x}, expected {:#x} (token {})", where(), w,
                             got, want, token);
      }
    }
    return {};
  }

  std::string expert_error(int64_t e) {
    const int64_t count = out.recv_count.at<int32_t>(e, 0);
    if (count < 0 || count > rows_per_expert)
      return fmt::format("expert {}: recv_count {} outside [0, {}]", e, count, rows_per_expert);
    struct Block {
      int64_t begin, count;
      int source;
    };
    std::vector<Block> blocks;
    int64_t total = 0;
    for (int s = 0; s < shape.num_ranks; ++s) {
      const auto packed = static_cast<uint64_t>(out.layout_range.at<int64_t>(e, s));
      const Block b{static_cast<int64_t>(packed >> 32), static_cast<int64_t>(packed & 0xffffffffu),
                    s};
      // A block of 0 rows may start anywhere (DeepEP's begin is then whatever the counter was).
      if (b.count > 0 && b.begin + b.count > count)
        return fmt::format("expert {}, source rank {}: block [{}, {}) outside the {} received rows",
                           e, s, b.begin, b.begin + b.count, count);
      if (std::string why = block_error(e, s, b.begin, b.count); !why.empty()) return why;
      if (b.count > 0) blocks.push_back(b);
      total += b.count;
    }
    if (count != total)
      return fmt::format("expert {}: recv_count {}, expected {}", e, count, total);
    std::sort(blocks.begin(), blocks.end(),
              [](const Block& a, const Block& b) { return a.begin < b.begin; });
    int64_t next = 0;
    for (const Block& b : blocks) {
      if (b.begin != next)
        return fmt::format(
            "expert {}, source rank {}: block starts at row {}, expected {} "
            "(blocks must tile [0, recv_count) without overlap)",
            e, b.source, b.begin, next);
      next = b.begin + b.count;
    }
    return {};
  }
};

}  // namespace

std::string check_ll_dispatch(std::span<const LlRankInputs> all, const EpShape& shape,
                              int64_t max_tokens, const LlFormat& format, int rank,
                              const LlDispatchOutputs& out) {
  if (const char* why = ll_format_error(format)) return why;
  if (static_cast<int>(all.size()) != shape.num_ranks || rank < 0 || rank >= shape.num_ranks ||
      max_tokens < 0)
    return fmt::format("{} inputs for {} ranks, rank {}, {} tokens per rank", all.size(),
                       shape.num_ranks, rank, max_tokens);
  Checker checker{all, shape, max_tokens, format, rank, out, shape.num_ranks * max_tokens, {}};
  if (std::string why = checker.inputs_error(); !why.empty()) return why;
  if (std::string why = checker.outputs_error(); !why.empty()) return why;
  checker.casts.resize(all.size());
  for (size_t s = 0; s < all.size(); ++s)
    checker.casts[s].resize(static_cast<size_t>(all[s].x.rows));
  for (int64_t e = 0; e < shape.experts_per_rank(); ++e)
    if (std::string why = checker.expert_error(e); !why.empty()) return why;
  return {};
}

Tensor reference_ll_combine(const TensorRef& topk_idx, const TensorRef& topk_weights,
                            uint32_t hidden, int home_rank, const LlExpertRow& expert_row) {
  const int64_t tokens = topk_idx.rows, topk = topk_idx.cols;
  Tensor out = Tensor::empty(DType::bf16, tokens, hidden);
  std::vector<float> acc(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < topk; ++k) {
      const int64_t expert = topk_idx.at<int64_t>(t, k);
      if (expert < 0) continue;
      const uint16_t* row = expert_row(expert, home_rank, t);
      if (row == nullptr) continue;
      const float w = topk_weights.at<float>(t, k);
      for (uint32_t c = 0; c < hidden; ++c)
        acc[c] = static_cast<float>(static_cast<double>(acc[c]) +
                                    static_cast<double>(mul(w, from_bf16(row[c]))));
    }
    uint16_t* o = out.data<uint16_t>() + t * hidden;
    for (uint32_t c = 0; c < hidden; ++c)
      o[c] = to_bf16(acc[c]);
  }
  return out;
}

}  // namespace proxyep::gpu_side::ep
