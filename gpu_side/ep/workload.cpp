// Synthetic MoE inputs. Reproducibility across processes, compilers and standard libraries is
// the point, so:
// - std::mt19937_64 is used only for its raw 64-bit output, which the standard fixes exactly;
//   the std::*_distribution classes are avoided (their algorithms are implementation-defined).
// - Each (seed, rank, purpose) gets its own generator, seeded through a fixed SplitMix64 mix, so
//   the routing of a rank does not change when, say, hidden changes.
// - Normals come from Box-Muller on 53-bit uniforms (log/sqrt/cos from libm, correctly rounded
//   in practice on the platforms we run).
#include "gpu_side/ep/workload.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>

namespace proxyep::gpu_side::ep {

namespace {

constexpr std::string_view kPhase = "workload";

// What each generator is for; part of the seed mix, so the values are part of the format.
enum class Stream : uint64_t { x = 1, routing = 2, drop = 3, weights = 4 };

// Zipf exponent of the skewed routing: weight of expert e is 1 / (e + 1)^s.
constexpr double kZipfExponent = 1.0;

uint64_t splitmix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

std::mt19937_64 make_generator(uint64_t seed, int rank, Stream stream) {
  uint64_t mixed = splitmix64(splitmix64(seed) ^ splitmix64(static_cast<uint64_t>(rank) + 1) ^
                              splitmix64(static_cast<uint64_t>(stream) << 32));
  return std::mt19937_64(mixed);
}

// Uniform in [0, 1) with 53 random bits.
double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n), n > 0, without modulo bias (rejects the short top range).
uint64_t uniform_below(std::mt19937_64& gen, uint64_t n) {
  uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    uint64_t draw = gen();
    if (draw >= threshold) return draw % n;
  }
}

// Standard normals, generated in Box-Muller pairs.
class NormalSource {
 public:
  explicit NormalSource(std::mt19937_64& gen) : gen_(gen) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 1.0 - uniform01(gen_);  // (0, 1]: log stays finite
    double u2 = uniform01(gen_);
    double radius = std::sqrt(-2.0 * std::log(u1));
    double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64& gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace

void check_workload(const WorkloadOptions& o) {
  const EpShape& s = o.shape;
  require(s.num_ranks >= 1 && s.ranks_per_node >= 1, kPhase,
          "num_ranks ({}) and ranks_per_node ({}) must be positive", s.num_ranks, s.ranks_per_node);
  require(s.num_experts >= 1 && s.num_experts % s.num_ranks == 0, kPhase,
          "num_experts ({}) must be a positive multiple of num_ranks ({})", s.num_experts,
          s.num_ranks);
  require(s.experts_per_rank() <= kMaxLocalExperts, kPhase,
          "{} experts per rank exceed the limit of {}", s.experts_per_rank(), kMaxLocalExperts);
  require(o.topk >= 1 && o.topk <= kMaxTopk, kPhase, "topk must be in [1, {}]; got {}", kMaxTopk,
          o.topk);
  require(o.topk <= s.num_experts, kPhase, "topk ({}) exceeds num_experts ({})", o.topk,
          s.num_experts);
  require(o.hidden >= 1, kPhase, "hidden must be positive; got {}", o.hidden);
  require(!o.fp8 || o.hidden % kScaleBlock == 0, kPhase,
          "hidden ({}) must be a multiple of {} for fp8 (one scale per {} channels)", o.hidden,
          kScaleBlock, kScaleBlock);
  require(
      !(o.fp8 && o.ue8m0) || o.hidden % kUe8m0PackBlock == 0, kPhase,
      "hidden ({}) must be a multiple of {} for UE8M0 scales (four {}-channel scales per int32)",
      o.hidden, kUe8m0PackBlock, kScaleBlock);
  require(o.num_tokens >= 0, kPhase, "num_tokens must be >= 0; got {}", o.num_tokens);
  require(o.tokens_per_rank.empty() || o.tokens_per_rank.size() == size_t(s.num_ranks), kPhase,
          "tokens_per_rank has {} entries; expected one per rank ({})", o.tokens_per_rank.size(),
          s.num_ranks);
  for (size_t r = 0; r < o.tokens_per_rank.size(); ++r)
    require(o.tokens_per_rank[r] >= 0, kPhase, "tokens_per_rank[{}] = {} is negative", r,
            o.tokens_per_rank[r]);
  require(o.drop_fraction >= 0.0 && o.drop_fraction <= 1.0, kPhase,
          "drop_fraction must be in [0, 1]; got {}", o.drop_fraction);
}

namespace {

void validate(const WorkloadOptions& o, int rank) {
  check_workload(o);
  const EpShape& s = o.shape;
  require(rank >= 0 && rank < s.num_ranks, kPhase, "rank {} is outside [0, {})", rank, s.num_ranks);
}

// Row `row` of a rank's x: every row is its own stream, so a checker regenerates the rows routed
// to it without the others (a rank of a 128-rank benchmark needs a few rows of each peer).
void fill_x_row(uint16_t* out, int hidden, uint64_t seed, int rank, int64_t row) {
  std::mt19937_64 gen = make_generator(seed, rank, Stream::x);
  gen.seed(gen() ^ splitmix64(static_cast<uint64_t>(row)));
  NormalSource normal(gen);
  for (int c = 0; c < hidden; ++c)
    out[c] = float_to_bf16(static_cast<float>(normal.next()));
}

// The `topk` experts with the largest keys; ties go to the lower expert id so the order is a
// strict one and the result does not depend on the sort's implementation.
void write_top_experts(const std::vector<double>& keys, int topk, std::vector<int>& order,
                       int64_t* row) {
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + topk, order.end(),
                    [&](int a, int b) { return keys[a] != keys[b] ? keys[a] > keys[b] : a < b; });
  for (int k = 0; k < topk; ++k)
    row[k] = order[k];
}

Tensor make_routing(const WorkloadOptions& o, int64_t tokens, std::mt19937_64 gen) {
  const int experts = o.shape.num_experts;
  Tensor idx = Tensor::empty(DType::i64, tokens, o.topk);
  int64_t* out = idx.data<int64_t>();
  if (o.routing == Routing::one_expert) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int k = 0; k < o.topk; ++k)
        out[t * o.topk + k] = k == 0 ? 0 : -1;
    return idx;
  }
  std::vector<double> keys(static_cast<size_t>(experts));
  std::vector<int> order(static_cast<size_t>(experts));
  // Skewed: weighted sampling without replacement (Efraimidis-Spirakis): the top-k of
  // log(u) / w_e picks expert e with probability proportional to w_e among those left.
  std::vector<double> inverse_weight(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e)
    inverse_weight[e] = std::pow(e + 1.0, kZipfExponent);
  NormalSource normal(gen);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) {
      if (o.routing == Routing::random)
        keys[e] = std::abs(normal.next()) + 1.0;  // DeepEP's tests: randn().abs() + 1
      else
        keys[e] = std::log(1.0 - uniform01(gen)) * inverse_weight[e];
    }
    write_top_experts(keys, o.topk, order, out + t * o.topk);
  }
  return idx;
}

// Replaces exactly round(drop_fraction * entries) entries, chosen uniformly (partial
// Fisher-Yates over entry positions), with -1.
void drop_entries(Tensor& idx, double fraction, std::mt19937_64 gen) {
  const int64_t entries = idx.numel();
  const auto drops = static_cast<int64_t>(std::llround(fraction * static_cast<double>(entries)));
  if (drops == 0) return;
  std::vector<int64_t> position(static_cast<size_t>(entries));
  std::iota(position.begin(), position.end(), 0);
  int64_t* out = idx.data<int64_t>();
  for (int64_t i = 0; i < drops; ++i) {
    auto pick = i + static_cast<int64_t>(uniform_below(gen, static_cast<uint64_t>(entries - i)));
    std::swap(position[i], position[pick]);
    out[position[i]] = -1;
  }
}

// Positive weights in [0.1, 1.1) for every slot, selected or not: a dropped slot keeps a non-zero
// weight so that dispatch's zeroing of it is observable.
Tensor make_weights(int64_t tokens, int topk, std::mt19937_64 gen) {
  Tensor w = Tensor::empty(DType::f32, tokens, topk);
  float* out = w.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i)
    out[i] = static_cast<float>(0.1 + uniform01(gen));
  return w;
}

// Whether `t` already is a 2-D tensor of this form, so a cast can write into it in place.
bool has_form(const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  return t.defined() && t.dtype() == dtype && t.dims() == 2 && t.rows() == rows && t.cols() == cols;
}

// Allocates unless the caller's tensor already has the form (it may be a view held elsewhere).
void ensure_form(Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  if (!has_form(t, dtype, rows, cols)) t = Tensor::empty(dtype, rows, cols);
}

// Largest magnitude of a 128-channel group, clamped to 1e-4 like DeepEP (an all-zero group still
// gets a finite, non-zero scale).
float group_amax(const uint16_t* group) {
  float amax = 0.0f;
  for (int c = 0; c < kScaleBlock; ++c)
    amax = std::max(amax, std::abs(bf16_to_float(group[c])));
  return std::max(amax, 1e-4f);
}

// ceil(log2(value)) of a positive normal float, read off its bits the way DeepEP's
// fast_log2_ceil does: the exponent, plus one unless the value is already a power of two.
int ceil_log2(float value) {
  const uint32_t bits = float_to_bits(value);
  const auto exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  return exponent + ((bits & 0x7fffffu) != 0 ? 1 : 0);
}

// 2^exponent for exponent in [-126, 127] (a normal float: exponent field only).
float pow2(int exponent) {
  return bits_to_float(static_cast<uint32_t>(exponent + 127) << 23);
}

}  // namespace

Routing parse_routing(std::string_view name) {
  if (name == "random") return Routing::random;
  if (name == "skewed") return Routing::skewed;
  if (name == "one-expert" || name == "one_expert") return Routing::one_expert;
  fail(std::string(kPhase), "unknown routing '{}'; expected random, skewed or one-expert", name);
}

std::string_view routing_name(Routing routing) {
  switch (routing) {
    case Routing::random:
      return "random";
    case Routing::skewed:
      return "skewed";
    case Routing::one_expert:
      return "one-expert";
  }
  return "?";
}

int WorkloadOptions::tokens_of(int rank) const {
  if (tokens_per_rank.empty()) return num_tokens;
  require(rank >= 0 && size_t(rank) < tokens_per_rank.size(), kPhase,
          "rank {} has no entry in tokens_per_rank ({} entries)", rank, tokens_per_rank.size());
  return tokens_per_rank[static_cast<size_t>(rank)];
}

RankInputs make_rank_routing(const WorkloadOptions& options, int rank) {
  validate(options, rank);
  const int64_t tokens = options.tokens_of(rank);
  const uint64_t seed = options.seed;
  RankInputs in;
  in.topk_idx = make_routing(options, tokens, make_generator(seed, rank, Stream::routing));
  drop_entries(in.topk_idx, options.drop_fraction, make_generator(seed, rank, Stream::drop));
  in.topk_weights = make_weights(tokens, options.topk, make_generator(seed, rank, Stream::weights));
  return in;
}

void make_x_rows(const WorkloadOptions& options, int rank, std::span<const int64_t> rows,
                 RankInputs& in) {
  validate(options, rank);
  const int64_t tokens = options.tokens_of(rank);
  if (!in.x.defined()) in.x = Tensor::zeros(DType::bf16, tokens, options.hidden);
  require(in.x.dtype() == DType::bf16 && in.x.rows() == tokens && in.x.cols() == options.hidden,
          kPhase, "x of rank {} must be bf16 [{}, {}]; got {}", rank, tokens, options.hidden,
          in.x.ref().describe());
  uint16_t* x = in.x.data<uint16_t>();
  for (const int64_t row : rows) {
    require(row >= 0 && row < tokens, kPhase, "row {} of rank {} is outside [0, {})", row, rank,
            tokens);
    fill_x_row(x + row * options.hidden, options.hidden, options.seed, rank, row);
  }
  if (options.fp8 && options.ue8m0)
    cast_to_fp8_ue8m0(in.x, in.x_fp8, in.x_scales);
  else if (options.fp8)
    cast_to_fp8(in.x, in.x_fp8, in.x_scales);
}

RankInputs make_rank_inputs(const WorkloadOptions& options, int rank) {
  RankInputs in = make_rank_routing(options, rank);
  std::vector<int64_t> rows(static_cast<size_t>(options.tokens_of(rank)));
  std::iota(rows.begin(), rows.end(), 0);
  make_x_rows(options, rank, rows, in);
  return in;
}

void cast_to_fp8(const Tensor& x_bf16, Tensor& x_fp8, Tensor& scales) {
  require_dtype(x_bf16.ref(), DType::bf16, kPhase, "x");
  require(x_bf16.dims() == 2 && x_bf16.cols() % kScaleBlock == 0, kPhase,
          "x must be 2-D with hidden a multiple of {}; got {}", kScaleBlock,
          x_bf16.ref().describe());
  const int64_t rows = x_bf16.rows(), hidden = x_bf16.cols(), groups = hidden / kScaleBlock;
  ensure_form(x_fp8, DType::fp8_e4m3, rows, hidden);
  ensure_form(scales, DType::f32, rows, groups);
  const uint16_t* in = x_bf16.data<uint16_t>();
  uint8_t* out = x_fp8.data<uint8_t>();
  float* scale = scales.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = t * hidden + g * kScaleBlock;
      const float amax = group_amax(in + base);
      // Same float32 operations as DeepEP's per_token_cast_to_fp8: x * (448 / amax).
      const float factor = kFp8E4m3Max / amax;
      for (int c = 0; c < kScaleBlock; ++c)
        out[base + c] = float_to_e4m3(bf16_to_float(in[base + c]) * factor);
      scale[t * groups + g] = amax / kFp8E4m3Max;
    }
  }
}

void cast_to_fp8_ue8m0(const Tensor& x_bf16, Tensor& x_fp8, Tensor& packed_scales) {
  require_dtype(x_bf16.ref(), DType::bf16, kPhase, "x");
  require(x_bf16.dims() == 2 && x_bf16.cols() % kUe8m0PackBlock == 0, kPhase,
          "x must be 2-D with hidden a multiple of {} for UE8M0 scales; got {}", kUe8m0PackBlock,
          x_bf16.ref().describe());
  const int64_t rows = x_bf16.rows(), hidden = x_bf16.cols(), groups = hidden / kScaleBlock;
  ensure_form(x_fp8, DType::fp8_e4m3, rows, hidden);
  ensure_form(packed_scales, DType::i32, rows, hidden / kUe8m0PackBlock);
  const uint16_t* in = x_bf16.data<uint16_t>();
  uint8_t* out = x_fp8.data<uint8_t>();
  // Row t's hidden / 512 int32s span `groups` bytes, group g at byte g of the row: DeepEP's
  // layout (it writes the exponent bytes through a uint8 view of the int32 tensor).
  auto* exponent_bytes = reinterpret_cast<uint8_t*>(packed_scales.raw());
  // DeepEP's float constant 1/448, so the rounding matches its kernels to the last bit.
  constexpr float kInverseMax = 1.0f / kFp8E4m3Max;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = t * hidden + g * kScaleBlock;
      const float amax = group_amax(in + base);
      // amax >= 1e-4 keeps amax / 448 a normal float and a finite bf16 amax keeps the exponent
      // within [-22, 120], so both pow2 calls below stay in range; an infinity would not.
      require(std::isfinite(amax), kPhase,
              "x[{}] holds an infinity in channels [{}, {}); UE8M0 scales need finite values", t,
              g * kScaleBlock, (g + 1) * kScaleBlock);
      const int exponent = ceil_log2(amax * kInverseMax);
      // Multiplying by a power of two is exact: the payload only rounds in the e4m3 cast.
      const float factor = pow2(-exponent);
      for (int c = 0; c < kScaleBlock; ++c)
        out[base + c] = float_to_e4m3(bf16_to_float(in[base + c]) * factor);
      exponent_bytes[t * groups + g] = static_cast<uint8_t>(float_to_bits(pow2(exponent)) >> 23);
    }
  }
}

}  // namespace proxyep::gpu_side::ep
