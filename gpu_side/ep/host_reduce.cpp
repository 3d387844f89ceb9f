#include "gpu_side/ep/host_reduce.hpp"

#include <algorithm>
#include <vector>

// The AVX2 clone doubles the vector width over the x86-64 baseline; the choice is made once, by
// an ifunc resolver, so one binary still runs on CPUs without AVX2. Other compilers and targets
// get the plain build of the same loops. Not under ThreadSanitizer: the resolver runs while the
// dynamic loader relocates, before the TSan runtime is up, and its instrumentation crashes there.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define PROXYEP_REDUCE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PROXYEP_REDUCE_CLONES
#endif

// GCC may refuse to inline a function built for the default target into a target_clones clone;
// a call in the hot loop would stop its vectorisation, so the helpers are forced inline.
#define PROXYEP_REDUCE_INLINE __attribute__((always_inline)) inline

namespace proxyep::gpu_side::ep {
namespace {

// Elements one pass over the sources sums: their 256 bytes of float sums stay in L1 while each
// source row adds 128 contiguous bytes, and the per-source loop cost is spread over 64 elements.
// A fixed count also lets GCC's -O2 cost model (which vectorises only loops that need no scalar
// epilogue) vectorise the loops.
constexpr int kBlock = 64;

// Whether the biases start the sums here: they lead (bias_first, or an order) and there is one.
// Leading biases that are both missing add +0 + +0 = +0 first, which changes no bit of a sum
// that starts from +0 anyway, so the rows alone are summed then (V2's order without biases
// would otherwise add two rows of zeros to every token).
PROXYEP_REDUCE_INLINE bool biases_start(const CombineInput& in) {
  return combine_biases_lead(in) && (in.bias0 != nullptr || in.bias1 != nullptr);
}

// Collects the rows token `t` sums, in combine_token's order: the groups combine_group walks
// (ranks ascending, or V2's order) that received t, then bias0, then bias1; when the biases
// start the sum (biases_start) the two come first (a missing one is `zeros`, a row of +0), and
// reduce_row adds them as a pair. Returns how many.
PROXYEP_REDUCE_INLINE int token_sources(const CombineInput& in, int64_t t, const uint16_t** src,
                                        const uint16_t* zeros) {
  const int32_t* head = in.send_head + t * in.num_ranks;
  const bool biases_lead = biases_start(in);
  int n = 0;
  if (biases_lead) {
    src[n++] = in.bias0 != nullptr ? in.bias0 + t * in.hidden : zeros;
    src[n++] = in.bias1 != nullptr ? in.bias1 + t * in.hidden : zeros;
  }
  for (int i = 0; i < in.num_ranks; ++i) {
    const int r = combine_group(in, t, i);
    if (r < 0) break;
    if (head[r] >= 0) src[n++] = block_row(in, r, head[r]);
  }
  if (!biases_lead && in.bias0 != nullptr) src[n++] = in.bias0 + t * in.hidden;
  if (!biases_lead && in.bias1 != nullptr) src[n++] = in.bias1 + t * in.hidden;
  return n;
}

// The NaN combine_token leaves where a sum is NaN. When two NaNs meet, x86 returns the first
// operand's, and which operand is first is the compiler's choice (it treats float addition as
// commutative), so the wide loops below cannot be trusted with it. combine_token as GCC builds
// it for the host adds `addps acc, x` with the row's value x first, so a NaN row value replaces
// an earlier NaN: the sum ends as the last NaN the rows hold, made quiet, or, with none, the
// default NaN that inf + -inf makes. NaN sums are rare, so they are redone here by that rule,
// which keeps the bits the same for the AVX2 and baseline clones and any compiler flags.
[[gnu::noinline, gnu::cold]] uint16_t nan_sum(const uint16_t* const* src, int n, int64_t e) {
  constexpr uint32_t kQuietBit = 0x00400000u, kDefaultNan = 0xffc00000u;
  uint32_t nan = kDefaultNan;
  for (int i = 0; i < n; ++i) {
    const float x = bf16_to_float(src[i][e]);
    if (x != x) nan = float_to_bits(x) | kQuietBit;
  }
  return float_to_bf16(bits_to_float(nan));
}

[[gnu::noinline, gnu::cold]] void fix_nans(const uint16_t* const* src, int n, uint16_t* out,
                                           int64_t hidden) {
  for (int64_t e = 0; e < hidden; ++e)
    if ((out[e] & 0x7fffu) > 0x7f80u) out[e] = nan_sum(src, n, e);
}

// out[0, W) = bf16(((0 + src[0][c + j]) + src[1][c + j]) + ...), n >= 1; or, `paired` (the
// biases first, n >= 2), bf16(((src[0][c + j] + src[1][c + j]) + src[2][c + j]) + ...). Returns
// whether any sum is NaN (its bits then still need nan_sum). The first source is added to 0
// rather than copied because combine_token does that: 0 + -0 is +0.
template <int W>
PROXYEP_REDUCE_INLINE bool reduce_block(const uint16_t* const* src, int n, int64_t c, uint16_t* out,
                                        bool paired) {
  float acc[W];
  if (paired) {
    for (int j = 0; j < W; ++j)
      acc[j] = bf16_to_float(src[0][c + j]) + bf16_to_float(src[1][c + j]);
  } else {
    for (int j = 0; j < W; ++j)
      acc[j] = 0.0f + bf16_to_float(src[0][c + j]);
  }
  for (int i = paired ? 2 : 1; i < n; ++i) {
    const uint16_t* s = src[i] + c;
    for (int j = 0; j < W; ++j)
      acc[j] += bf16_to_float(s[j]);
  }
  int nan = 0;
  for (int j = 0; j < W; ++j) {
    out[j] = float_to_bf16(acc[j]);
    nan |= acc[j] != acc[j];
  }
  return nan != 0;
}

// One token's row: wide blocks, then the chunk-sized rest (hidden is a multiple of the chunk).
PROXYEP_REDUCE_INLINE void reduce_row(const uint16_t* const* src, int n, uint16_t* out,
                                      int64_t hidden, bool paired) {
  if (n == 0) {  // no rank received the token and there is no bias: the sum of nothing
    std::fill_n(out, hidden, float_to_bf16(0.0f));
    return;
  }
  bool nan = false;
  int64_t c = 0;
  for (; c + kBlock <= hidden; c += kBlock)
    nan |= reduce_block<kBlock>(src, n, c, out + c, paired);
  for (; c < hidden; c += kCombineChunk)
    nan |= reduce_block<kCombineChunk>(src, n, c, out + c, paired);
  if (nan) fix_nans(src, n, out, hidden);
}

}  // namespace

PROXYEP_REDUCE_CLONES
void reduce_tokens_host(const CombineInput& in, int64_t begin, int64_t end) {
  // One list for the whole range: at most every rank plus the two biases.
  std::vector<const uint16_t*> src(static_cast<size_t>(in.num_ranks) + 2);
  const bool biases_lead = biases_start(in);
  std::vector<uint16_t> zeros;  // a missing bias when the biases lead
  if (biases_lead && (in.bias0 == nullptr || in.bias1 == nullptr))
    zeros.assign(static_cast<size_t>(in.hidden), 0);
  for (int64_t t = begin; t < end; ++t) {
    const int n = token_sources(in, t, src.data(), zeros.data());
    reduce_row(src.data(), n, in.out + t * in.hidden, in.hidden, biases_lead);
    // A few floats per token, not worth vectorising: combine_token's own loop (weight selection
    // included).
    combine_token_weights(in, t, HostLanes{});
  }
}

}  // namespace proxyep::gpu_side::ep
