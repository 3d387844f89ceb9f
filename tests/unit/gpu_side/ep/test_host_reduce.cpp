// reduce_tokens_host must write exactly the bytes combine_token writes (the CUDA kernel runs
// combine_token, so any difference would split host and device results). The data is chosen so
// that a change in the float operations shows: values over a wide exponent range (float sums
// round, so the order of the adds matters), NaNs with different payloads and signs, infinities
// of both signs, -0 (0 + -0 is +0), subnormals, sums that land exactly halfway between two bf16
// values, and sums that overflow. Each case also checks that the data really exercises those
// paths, and that a reduce adding the same rows in another order would have been caught.
//
// One thing IEEE 754 leaves open: an add whose operands are both NaN may return either. x86
// returns its first operand, and which one that is is the compiler's choice, so combine_token's
// bits there change with the build (GCC at -O2 returns the row's NaN; -O0, -O3 and Clang builds
// differ). Those elements are checked against the rule host_reduce.cpp pins instead
// (which is what the -O2 build of combine_token gives); every other bit must match.
#include "gpu_side/ep/host_reduce.hpp"

#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

using namespace proxyep::gpu_side::ep;

namespace {

// Small deterministic generator for test inputs.
struct Random {
  uint64_t state;
  uint32_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 32);
  }
  uint32_t below(uint32_t n) { return next() % n; }
};

uint16_t bf16_bits(uint32_t sign, uint32_t exponent, uint32_t mantissa) {
  return static_cast<uint16_t>((sign << 15) | (exponent << 7) | (mantissa & 0x7f));
}

// One bf16 element. Most are values near 1 (their sums round in float only rarely, so halfway
// cases and exact results both occur); the rest cover the special encodings and a wide exponent
// range.
uint16_t random_bf16(Random& rng) {
  const uint32_t sign = rng.below(2), mantissa = rng.below(128), kind = rng.below(100);
  if (kind < 45) return bf16_bits(sign, 126 + rng.below(3), mantissa);
  if (kind < 55) return bf16_bits(sign, 118 + rng.below(4), mantissa);  // a half-ulp of the above
  if (kind < 80) return bf16_bits(sign, 96 + rng.below(64), mantissa);  // 2^-31 .. 2^32
  if (kind < 83) return bf16_bits(sign, 253 + rng.below(2), mantissa);  // near the largest finite
  if (kind < 88) return bf16_bits(sign, 0, mantissa | 1);               // subnormal
  if (kind < 91) return bf16_bits(sign, 1, mantissa);                   // smallest normals
  if (kind < 96) return bf16_bits(sign, 0, 0);                          // +-0
  if (kind < 98) return bf16_bits(sign, 255, 0);                        // +-inf
  return bf16_bits(sign, 255, mantissa | (rng.below(2) != 0 ? 1 : 0x40));  // NaN, quiet or not
}

// Weights over a wide exponent range too, so reordering their sum shows.
float random_weight(Random& rng) {
  const uint32_t sign = rng.below(2) << 31, kind = rng.below(20);
  if (kind == 0) return bits_to_float(sign | 0x7fc00000u | rng.below(1u << 22));  // NaN
  if (kind == 1) return bits_to_float(sign);                                      // +-0
  return bits_to_float(sign | ((107 + rng.below(40)) << 23) |
                       rng.below(1u << 23));  // 2^-20 .. 2^20
}

struct Case {
  int ranks = 1;
  int64_t hidden = 16;
  int64_t tokens = 8;
  int topk = 0;
  bool bias0 = false, bias1 = false;
  uint64_t seed = 1;
};

bool is_nan_bf16(uint16_t b) {
  return (b & 0x7fff) > 0x7f80;
}

// A combine's inputs: per-rank blocks whose rows come back in shuffled order, tokens that some
// ranks did not receive (head -1), optional biases and weights.
struct World {
  Case c;
  std::vector<std::vector<uint16_t>> rows;
  std::vector<std::vector<float>> weights;
  std::vector<const uint16_t*> row_ptrs;
  std::vector<const float*> weight_ptrs;
  std::vector<int32_t> send_head;
  std::vector<uint16_t> bias0, bias1;

  explicit World(const Case& cs) : c(cs) {
    Random rng{cs.seed};
    send_head.assign(static_cast<size_t>(cs.tokens * cs.ranks), -1);
    rows.resize(static_cast<size_t>(cs.ranks));
    weights.resize(static_cast<size_t>(cs.ranks));
    for (int r = 0; r < cs.ranks; ++r)
      fill_block(rng, r);
    for (auto& b : weights)
      weight_ptrs.push_back(b.data());
    for (auto& b : rows)
      row_ptrs.push_back(b.data());
    if (cs.bias0) bias0 = random_rows(rng, cs.tokens * cs.hidden);
    if (cs.bias1) bias1 = random_rows(rng, cs.tokens * cs.hidden);
  }

  static std::vector<uint16_t> random_rows(Random& rng, int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v)
      x = random_bf16(rng);
    return v;
  }

  // Rank r receives each token with probability 2/3, at a shuffled position in its block.
  void fill_block(Random& rng, int r) {
    std::vector<int64_t> received;
    for (int64_t t = 0; t < c.tokens; ++t)
      if (rng.below(3) != 0) received.push_back(t);
    for (size_t i = received.size(); i > 1; --i)
      std::swap(received[i - 1], received[rng.below(static_cast<uint32_t>(i))]);
    for (size_t pos = 0; pos < received.size(); ++pos)
      send_head[static_cast<size_t>(received[pos] * c.ranks + r)] = static_cast<int32_t>(pos);
    const auto n = static_cast<int64_t>(received.size());
    rows[static_cast<size_t>(r)] = random_rows(rng, n * c.hidden);
    weights[static_cast<size_t>(r)].resize(static_cast<size_t>(n * c.topk));
    for (auto& w : weights[static_cast<size_t>(r)])
      w = random_weight(rng);
  }

  // Rows and biases without NaNs (each becomes 1.0): results can then be compared by value.
  void replace_nans() {
    auto no_nan = [](std::vector<uint16_t>& v) {
      for (auto& x : v)
        if (is_nan_bf16(x)) x = float_to_bf16(1.0f);
    };
    for (auto& r : rows)
      no_nan(r);
    no_nan(bias0);
    no_nan(bias1);
  }

  CombineInput input(uint16_t* out, float* out_weights) const {
    return CombineInput{.block_rows = row_ptrs.data(),
                        .block_weights = c.topk > 0 ? weight_ptrs.data() : nullptr,
                        .send_head = send_head.data(),
                        .bias0 = c.bias0 ? bias0.data() : nullptr,
                        .bias1 = c.bias1 ? bias1.data() : nullptr,
                        .out = out,
                        .out_weights = out_weights,
                        .num_ranks = c.ranks,
                        .hidden = c.hidden,
                        .topk = c.topk};
  }
};

struct Result {
  std::vector<uint16_t> x;
  std::vector<float> weights;
  explicit Result(const Case& c)
      : x(static_cast<size_t>(c.tokens * c.hidden), 0xdead),
        weights(static_cast<size_t>(c.tokens * c.topk), -7.0f) {}
};

Result run_combine_token(const World& w) {
  Result r(w.c);
  const CombineInput in = w.input(r.x.data(), r.weights.data());
  for (int64_t t = 0; t < w.c.tokens; ++t)
    combine_token(in, t, HostLanes{});
  return r;
}

// Split into two ranges, as the executor's token blocks do.
Result run_host_reduce(const World& w) {
  Result r(w.c);
  const CombineInput in = w.input(r.x.data(), r.weights.data());
  const int64_t split = w.c.tokens / 3;
  reduce_tokens_host(in, 0, split);
  reduce_tokens_host(in, split, w.c.tokens);
  return r;
}

// What the data covers, summed over all cases: each path the reduce must reproduce.
struct Coverage {
  int64_t ties = 0, nans = 0, infs = 0, subnormals = 0, overflows = 0;
  int64_t invalid = 0;    // inf + -inf with no NaN row
  int64_t nan_pairs = 0;  // an add meets two NaNs
  int64_t negative_zero_alone = 0;
  int64_t weight_nan_pairs = 0;
  int64_t weight_reorder_caught = 0;
  int64_t reorder_caught = 0;  // elements a reduce adding the rows in reverse would get wrong
};

// The rows token t adds, in combine_token's order.
std::vector<const uint16_t*> sources(const World& w, int64_t t) {
  std::vector<const uint16_t*> s;
  for (int r = 0; r < w.c.ranks; ++r) {
    const int32_t pos = w.send_head[static_cast<size_t>(t * w.c.ranks + r)];
    if (pos >= 0) s.push_back(w.rows[static_cast<size_t>(r)].data() + pos * w.c.hidden);
  }
  if (w.c.bias0) s.push_back(w.bias0.data() + t * w.c.hidden);
  if (w.c.bias1) s.push_back(w.bias1.data() + t * w.c.hidden);
  return s;
}

// Element j's addends, in order.
std::vector<float> addends(const std::vector<const uint16_t*>& s, int64_t j) {
  std::vector<float> a;
  for (const uint16_t* row : s)
    a.push_back(bf16_to_float(row[j]));
  return a;
}

// Weight k of token t's addends, in order.
std::vector<float> weight_addends(const World& w, int64_t t, int k) {
  std::vector<float> a;
  for (int r = 0; r < w.c.ranks; ++r) {
    const int32_t pos = w.send_head[static_cast<size_t>(t * w.c.ranks + r)];
    if (pos >= 0)
      a.push_back(w.weights[static_cast<size_t>(r)][static_cast<size_t>(pos * w.c.topk + k)]);
  }
  return a;
}

bool is_nan(float f) {
  return f != f;
}

// Whether summing `a` from 0 meets an add whose operands are both NaN (the result's bits are
// then the compiler's choice).
bool two_nans_meet(const std::vector<float>& a) {
  float acc = 0.0f;
  for (float x : a) {
    if (is_nan(acc) && is_nan(x)) return true;
    acc += x;
  }
  return false;
}

// host_reduce.cpp's rule for such sums: the last NaN addend, made quiet, else the default NaN.
uint16_t pinned_nan(const std::vector<float>& a) {
  uint32_t nan = 0xffc00000u;
  for (float x : a)
    if (is_nan(x)) nan = float_to_bits(x) | 0x00400000u;
  return float_to_bf16(bits_to_float(nan));
}

void compare_rows(const World& w, const Result& expected, const Result& got, Coverage& cov) {
  for (int64_t t = 0; t < w.c.tokens; ++t) {
    const std::vector<const uint16_t*> s = sources(w, t);
    for (int64_t j = 0; j < w.c.hidden; ++j) {
      const auto i = static_cast<size_t>(t * w.c.hidden + j);
      const std::vector<float> a = addends(s, j);
      const bool open = two_nans_meet(a);
      cov.nan_pairs += open ? 1 : 0;
      if (open ? is_nan_bf16(expected.x[i]) && got.x[i] == pinned_nan(a)
               : expected.x[i] == got.x[i])
        continue;
      CAPTURE(t);
      CAPTURE(j);
      CAPTURE(open);
      CAPTURE(expected.x[i]);
      CAPTURE(got.x[i]);
      FAIL("combined row element differs from combine_token");
    }
  }
}

// Weights: the same loop as combine_token's, so only the NaN-meets-NaN choice may differ.
void compare_weights(const World& w, const Result& expected, const Result& got, Coverage& cov) {
  for (int64_t t = 0; t < w.c.tokens; ++t) {
    for (int k = 0; k < w.c.topk; ++k) {
      const auto i = static_cast<size_t>(t * w.c.topk + k);
      const float e = expected.weights[i], g = got.weights[i];
      const bool open = two_nans_meet(weight_addends(w, t, k));
      cov.weight_nan_pairs += open ? 1 : 0;
      if (open ? is_nan(e) && is_nan(g) : float_to_bits(e) == float_to_bits(g)) continue;
      CAPTURE(t);
      CAPTURE(k);
      CAPTURE(float_to_bits(e));
      CAPTURE(float_to_bits(g));
      FAIL("combined weight differs from combine_token");
    }
  }
}

void measure_weights(const World& w, const Result& expected, Coverage& cov) {
  for (int64_t t = 0; t < w.c.tokens; ++t) {
    for (int k = 0; k < w.c.topk; ++k) {
      const std::vector<float> a = weight_addends(w, t, k);
      float backward = 0.0f;
      for (size_t i = a.size(); i > 0; --i)
        backward += a[i - 1];
      const float e = expected.weights[static_cast<size_t>(t * w.c.topk + k)];
      cov.weight_reorder_caught += float_to_bits(backward) != float_to_bits(e) ? 1 : 0;
    }
  }
}

// Counts what the sums of this case go through, by re-adding each element forwards (the
// documented order) and backwards.
void measure_rows(const World& w, const Result& expected, Coverage& cov) {
  for (int64_t t = 0; t < w.c.tokens; ++t) {
    const std::vector<const uint16_t*> s = sources(w, t);
    for (int64_t j = 0; j < w.c.hidden; ++j) {
      float forward = 0.0f, backward = 0.0f;
      bool nan_inputs = false, finite_inputs = true;
      for (size_t i = 0; i < s.size(); ++i) {
        forward += bf16_to_float(s[i][j]);
        backward += bf16_to_float(s[s.size() - 1 - i][j]);
        nan_inputs = nan_inputs || is_nan_bf16(s[i][j]);
        finite_inputs = finite_inputs && (s[i][j] & 0x7f80) != 0x7f80;
      }
      const uint32_t bits = float_to_bits(forward);
      const uint16_t out = expected.x[static_cast<size_t>(t * w.c.hidden + j)];
      cov.ties += (bits & 0xffff) == 0x8000 && (bits & 0x7f800000) != 0x7f800000 ? 1 : 0;
      cov.nans += is_nan_bf16(out) ? 1 : 0;
      cov.invalid += !nan_inputs && is_nan_bf16(out) ? 1 : 0;
      cov.infs += (out & 0x7fff) == 0x7f80 ? 1 : 0;
      cov.overflows += finite_inputs && (out & 0x7fff) == 0x7f80 ? 1 : 0;
      cov.subnormals += (out & 0x7f80) == 0 && (out & 0x7f) != 0 ? 1 : 0;
      cov.negative_zero_alone += s.size() == 1 && s[0][j] == 0x8000 ? 1 : 0;
      cov.reorder_caught += float_to_bf16(backward) != out ? 1 : 0;
    }
  }
}

void check_case(const Case& c, Coverage& cov) {
  CAPTURE(c.ranks);
  CAPTURE(c.hidden);
  CAPTURE(c.topk);
  CAPTURE(c.bias0);
  CAPTURE(c.bias1);
  const World w(c);
  const Result expected = run_combine_token(w);
  const Result got = run_host_reduce(w);
  compare_rows(w, expected, got, cov);
  compare_weights(w, expected, got, cov);
  measure_rows(w, expected, cov);
  measure_weights(w, expected, cov);
}

// A case of `ranks` blocks of `hidden`, few tokens for DeepSeek's 7168; bit 0 of `biases` gives
// bias0, bit 1 bias1.
Case sized_case(int64_t hidden, int ranks, int biases, int topk, uint64_t seed) {
  Case c;
  c.ranks = ranks;
  c.hidden = hidden;
  c.tokens = hidden >= 7168 ? 5 : 24;
  c.bias0 = (biases & 1) != 0;
  c.bias1 = (biases & 2) != 0;
  c.topk = topk;
  c.seed = seed;
  return c;
}

}  // namespace

TEST_CASE("host reduce: same bits as combine_token over ranks, biases, weights and hidden sizes") {
  Coverage cov;
  uint64_t seed = 1;
  // 8 and 16 are below one wide block, 200 is three blocks and a chunk, 7168 is DeepSeek's.
  for (int64_t hidden : {8, 16, 200, 256, 7168}) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      for (int bias = 0; bias < 4; ++bias) {
        check_case(
            sized_case(hidden, ranks, bias, (ranks + bias) % 3 == 0 ? 0 : 1 + ranks % 8, seed++),
            cov);
      }
    }
  }
  INFO("ties " << cov.ties << ", NaN " << cov.nans << ", NaN pairs " << cov.nan_pairs << ", inf "
               << cov.infs << ", overflow " << cov.overflows << ", subnormal " << cov.subnormals
               << ", inf - inf " << cov.invalid << ", lone -0 " << cov.negative_zero_alone
               << ", reorder caught " << cov.reorder_caught << ", weight NaN pairs "
               << cov.weight_nan_pairs << ", weight reorder caught " << cov.weight_reorder_caught);
  CHECK(cov.ties > 100);
  CHECK(cov.nans > 100);
  CHECK(cov.nan_pairs > 100);
  CHECK(cov.infs > 100);
  CHECK(cov.overflows > 100);
  CHECK(cov.subnormals > 100);
  CHECK(cov.negative_zero_alone > 10);
  CHECK(cov.invalid > 100);
  CHECK(cov.reorder_caught > 100);
  CHECK(cov.weight_nan_pairs > 10);
  CHECK(cov.weight_reorder_caught > 100);
}

TEST_CASE("host reduce: tokens no rank received and no bias come out as +0") {
  Case c;
  c.ranks = 3;
  c.hidden = 72;
  c.tokens = 4;
  c.topk = 2;
  World w(c);
  std::fill(w.send_head.begin(), w.send_head.end(), -1);
  const Result got = run_host_reduce(w);
  CHECK(std::all_of(got.x.begin(), got.x.end(), [](uint16_t b) { return b == 0; }));
  CHECK(std::all_of(got.weights.begin(), got.weights.end(),
                    [](float f) { return float_to_bits(f) == 0; }));
  const Result expected = run_combine_token(w);
  CHECK(expected.x == got.x);
}

// Blocks left in chunks where they landed (CombineInput::block_chunks): every rank's rows split
// into chunks of 3 rows copied to scattered places in one pool, in reverse order with gaps, and
// rank 0's block left contiguous. Each reduce reads the same rows either way, so it writes the
// same bits (each compared with itself: which NaN two NaNs give is the compiler's choice).
TEST_CASE("host reduce: blocks in scattered chunks reduce like contiguous ones") {
  Case c;
  c.ranks = 4;
  c.hidden = 200;
  c.tokens = 40;
  c.topk = 3;
  c.bias0 = true;
  c.seed = 99;
  World w(c);
  constexpr int64_t kPer = 3;
  std::vector<uint16_t> pool;
  std::vector<std::vector<size_t>> offsets(static_cast<size_t>(c.ranks));
  for (int r = 1; r < c.ranks; ++r) {
    const auto& block = w.rows[static_cast<size_t>(r)];
    const auto rows = static_cast<int64_t>(block.size()) / c.hidden;
    const int64_t chunks = (rows + kPer - 1) / kPer;
    offsets[static_cast<size_t>(r)].resize(static_cast<size_t>(chunks));
    for (int64_t k = chunks - 1; k >= 0; --k) {
      pool.resize(pool.size() + static_cast<size_t>(c.hidden));  // a gap before each chunk
      offsets[static_cast<size_t>(r)][static_cast<size_t>(k)] = pool.size();
      const int64_t n = std::min(kPer, rows - k * kPer);
      pool.insert(pool.end(), block.begin() + k * kPer * c.hidden,
                  block.begin() + (k * kPer + n) * c.hidden);
    }
  }
  std::vector<std::vector<const uint16_t*>> chunks(static_cast<size_t>(c.ranks));
  std::vector<const uint16_t* const*> chunk_ptrs(static_cast<size_t>(c.ranks), nullptr);
  std::vector<int64_t> chunk_rows(static_cast<size_t>(c.ranks), 0);
  for (int r = 1; r < c.ranks; ++r) {
    for (size_t off : offsets[static_cast<size_t>(r)])
      chunks[static_cast<size_t>(r)].push_back(pool.data() + off);
    chunk_ptrs[static_cast<size_t>(r)] = chunks[static_cast<size_t>(r)].data();
    chunk_rows[static_cast<size_t>(r)] = kPer;
  }
  const Result expected = run_host_reduce(w), expected_rule = run_combine_token(w);
  Result got(c);
  CombineInput in = w.input(got.x.data(), got.weights.data());
  std::vector<const uint16_t*> no_rows(static_cast<size_t>(c.ranks), nullptr);
  no_rows[0] = w.row_ptrs[0];  // the chunked ranks' block_rows must not be read
  in.block_rows = no_rows.data();
  in.block_chunks = chunk_ptrs.data();
  in.block_chunk_rows = chunk_rows.data();
  reduce_tokens_host(in, 0, c.tokens);
  CHECK(got.x == expected.x);
  Result via_rule(c);
  in.out = via_rule.x.data();
  in.out_weights = via_rule.weights.data();
  for (int64_t t = 0; t < c.tokens; ++t)
    combine_token(in, t, HostLanes{});
  CHECK(via_rule.x == expected_rule.x);
}

TEST_CASE("host reduce: biases first (hierarchical's last step) gives combine_token's bits") {
  // (bias0 + bias1) + row_r0 + row_r1 + ..., a missing bias +0. NaNs left out: which of two NaN
  // biases the pair returns is the compiler's choice (host_reduce.hpp), and the nodes' partial
  // sums it adds are the output of an earlier reduce anyway.
  uint64_t seed = 9000;
  int64_t differs_from_biases_last = 0;
  for (int64_t hidden : {8, 200, 7168}) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      for (int bias = 0; bias < 4; ++bias) {
        const Case c = sized_case(hidden, ranks, bias, ranks % 3, seed++);
        CAPTURE(ranks);
        CAPTURE(hidden);
        CAPTURE(bias);
        World w(c);
        w.replace_nans();
        Result last(c), expected(c), got(c);
        CombineInput in = w.input(last.x.data(), last.weights.data());
        for (int64_t t = 0; t < c.tokens; ++t)
          combine_token(in, t, HostLanes{});
        in.bias_first = true;
        in.out = expected.x.data();
        in.out_weights = expected.weights.data();
        for (int64_t t = 0; t < c.tokens; ++t)
          combine_token(in, t, HostLanes{});
        in.out = got.x.data();
        in.out_weights = got.weights.data();
        reduce_tokens_host(in, 0, c.tokens / 2);
        reduce_tokens_host(in, c.tokens / 2, c.tokens);
        REQUIRE(got.x == expected.x);
        // Bits, not values: a NaN weight must come out as the same NaN.
        REQUIRE(got.weights.size() == expected.weights.size());
        for (size_t i = 0; i < got.weights.size(); ++i)
          REQUIRE(float_to_bits(got.weights[i]) == float_to_bits(expected.weights[i]));
        // And the rule itself, element by element: the biases' sum first.
        for (int64_t t = 0; t < c.tokens; ++t)
          for (int64_t j = 0; j < hidden; ++j) {
            const auto at = static_cast<size_t>(t * hidden + j);
            float acc = (c.bias0 ? bf16_to_float(w.bias0[at]) : 0.0f) +
                        (c.bias1 ? bf16_to_float(w.bias1[at]) : 0.0f);
            for (int r = 0; r < ranks; ++r) {
              const int32_t pos = w.send_head[static_cast<size_t>(t * ranks + r)];
              if (pos >= 0)
                acc += bf16_to_float(
                    w.rows[static_cast<size_t>(r)][static_cast<size_t>(pos * hidden + j)]);
            }
            REQUIRE(got.x[at] == float_to_bf16(acc));
            differs_from_biases_last += got.x[at] != last.x[at] ? 1 : 0;
          }
      }
    }
  }
  CHECK(differs_from_biases_last > 20);  // the order matters, and is tested
}

TEST_CASE("host reduce: V2's order and weight owners give combine_token's bits") {
  // Arbitrary tables, not only combine_order.hpp's: each token's ranks shuffled, the list cut
  // short at random (-1 after it), some listed ranks not having received the token (head -1,
  // skipped), owners anywhere in [-1, ranks). NaNs left out of the rows, as above; weights keep
  // theirs: a selection copies bits, NaN or not.
  uint64_t seed = 12000;
  int64_t differs_from_v1 = 0;
  for (int64_t hidden : {8, 200, 7168}) {
    for (int ranks = 1; ranks <= 6; ++ranks) {
      for (int bias = 0; bias < 4; ++bias) {
        const Case c = sized_case(hidden, ranks, bias, 1 + ranks % 4, seed++);
        CAPTURE(ranks);
        CAPTURE(hidden);
        CAPTURE(bias);
        World w(c);
        w.replace_nans();
        Random rng{seed * 31};
        std::vector<int32_t> order(static_cast<size_t>(c.tokens * ranks), -1);
        std::vector<int32_t> owner(static_cast<size_t>(c.tokens * c.topk));
        for (int64_t t = 0; t < c.tokens; ++t) {
          int32_t* list = order.data() + t * ranks;
          for (int i = 0; i < ranks; ++i)
            list[i] = i;
          for (int i = ranks; i > 1; --i)
            std::swap(list[i - 1], list[rng.below(static_cast<uint32_t>(i))]);
          for (int i = static_cast<int>(rng.below(static_cast<uint32_t>(ranks) + 2)); i < ranks;
               ++i)
            list[i] = -1;  // usually the whole list, sometimes cut short
          for (int k = 0; k < c.topk; ++k)
            owner[static_cast<size_t>(t * c.topk + k)] =
                static_cast<int32_t>(rng.below(static_cast<uint32_t>(ranks) + 1)) - 1;
        }
        Result v1(c), expected(c), got(c);
        CombineInput in = w.input(v1.x.data(), v1.weights.data());
        for (int64_t t = 0; t < c.tokens; ++t)
          combine_token(in, t, HostLanes{});
        in.order = order.data();
        in.weight_owner = owner.data();
        in.out = expected.x.data();
        in.out_weights = expected.weights.data();
        for (int64_t t = 0; t < c.tokens; ++t)
          combine_token(in, t, HostLanes{});
        in.out = got.x.data();
        in.out_weights = got.weights.data();
        reduce_tokens_host(in, 0, c.tokens / 2);
        reduce_tokens_host(in, c.tokens / 2, c.tokens);
        REQUIRE(got.x == expected.x);
        for (size_t i = 0; i < got.weights.size(); ++i)
          REQUIRE(float_to_bits(got.weights[i]) == float_to_bits(expected.weights[i]));
        // And the rule itself: the biases' sum, then the listed ranks that received the token.
        for (int64_t t = 0; t < c.tokens; ++t) {
          const int32_t* head = w.send_head.data() + t * ranks;
          for (int64_t j = 0; j < hidden; ++j) {
            const auto at = static_cast<size_t>(t * hidden + j);
            float acc = (c.bias0 ? bf16_to_float(w.bias0[at]) : 0.0f) +
                        (c.bias1 ? bf16_to_float(w.bias1[at]) : 0.0f);
            for (int i = 0; i < ranks && order[static_cast<size_t>(t * ranks + i)] >= 0; ++i) {
              const int32_t r = order[static_cast<size_t>(t * ranks + i)];
              if (head[r] >= 0)
                acc += bf16_to_float(
                    w.rows[static_cast<size_t>(r)][static_cast<size_t>(head[r] * hidden + j)]);
            }
            REQUIRE(got.x[at] == float_to_bf16(acc));
            differs_from_v1 += got.x[at] != v1.x[at] ? 1 : 0;
          }
          for (int k = 0; k < c.topk; ++k) {
            const int32_t g = owner[static_cast<size_t>(t * c.topk + k)];
            const float want =
                g >= 0 && head[g] >= 0
                    ? w.weights[static_cast<size_t>(g)][static_cast<size_t>(head[g] * c.topk + k)]
                    : 0.0f;
            REQUIRE(float_to_bits(got.weights[static_cast<size_t>(t * c.topk + k)]) ==
                    float_to_bits(want));
          }
        }
      }
    }
  }
  CHECK(differs_from_v1 > 100);  // the order matters, and is tested
}
