// The low-latency routing rule's CPU twin (gpu_side/ep/ll_route.hpp) against the rule as written
// (a position is the number of earlier selections of the same expert, counted one by one), on
// random routings with drops, repeated experts within a token and hot experts, and on a case
// worked by hand; bad values are counted, never placed; bad sizes are refused. The routed
// combine finds each row where the host protocol places its message; the mismatch count counts.
#include "gpu_side/ep/ll_route.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

using namespace proxyep::gpu_side::ep;

namespace {

struct Routed {
  std::vector<int32_t> counts, positions;
  int32_t invalid = -7;  // the twin must overwrite it
};

Routed route(const std::vector<int64_t>& topk_idx, int64_t tokens, int topk, int32_t experts) {
  Routed r;
  r.counts.assign(static_cast<size_t>(experts), -7);
  r.positions.assign(topk_idx.size(), -7);
  ll_route_on_host({.topk_idx = topk_idx.data(),
                    .num_tokens = tokens,
                    .topk = topk,
                    .num_experts = experts,
                    .counts = r.counts.data(),
                    .positions = r.positions.data(),
                    .invalid = &r.invalid});
  return r;
}

}  // namespace

TEST_CASE("ll_route: a case worked by hand") {
  // 3 tokens, top-3, 4 experts: expert 2 is named by every token, token 1 drops a selection and
  // names expert 0 twice, token 2 names expert 9 (no such expert) and -5.
  const std::vector<int64_t> idx = {2, 0, 3, /**/ 0, -1, 2, /**/ 9, 2, -5};
  const Routed r = route(idx, 3, 3, 4);
  CHECK(r.counts == std::vector<int32_t>{2, 0, 3, 1});
  CHECK(r.positions == std::vector<int32_t>{0, 0, 0, 1, -1, 1, -1, 2, -1});
  CHECK(r.invalid == 2);
}

TEST_CASE("ll_route: positions are the number of earlier selections of the same expert") {
  std::mt19937_64 rng(20261204);
  for (int round = 0; round < 200; ++round) {
    const int64_t tokens = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    const int topk = std::uniform_int_distribution<int>(1, kLlMaxTopk)(rng);
    const int32_t experts = std::uniform_int_distribution<int32_t>(1, 300)(rng);
    // A few hot experts take most selections; some are dropped (-1) and a few are out of range.
    std::uniform_int_distribution<int64_t> any(0, experts - 1), hot(0, std::min(experts, 4) - 1);
    std::uniform_real_distribution<double> u;
    std::vector<int64_t> idx(static_cast<size_t>(tokens * topk));
    int32_t want_invalid = 0;
    for (int64_t& e : idx) {
      const double p = u(rng);
      if (p < 0.1) {
        e = -1;
      } else if (p < 0.12) {
        e = u(rng) < 0.5 ? experts + any(rng) : -2 - any(rng);
        ++want_invalid;
      } else {
        e = p < 0.6 ? hot(rng) : any(rng);
      }
    }
    const Routed r = route(idx, tokens, topk, experts);
    std::vector<int32_t> want_counts(static_cast<size_t>(experts), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      const int64_t e = idx[i];
      if (e < 0 || e >= experts) {
        REQUIRE(r.positions[i] == -1);
        continue;
      }
      int32_t earlier = 0;
      for (size_t j = 0; j < i; ++j)
        earlier += idx[j] == e ? 1 : 0;
      REQUIRE(r.positions[i] == earlier);
      ++want_counts[static_cast<size_t>(e)];
    }
    REQUIRE(r.counts == want_counts);
    REQUIRE(r.invalid == want_invalid);
  }
}

TEST_CASE("ll_route: sizes a kernel cannot take are refused") {
  const LlRouteParams good{.num_tokens = 4, .topk = 2, .num_experts = 8};
  CHECK(ll_route_error(good) == nullptr);
  auto with = [&](auto change) {
    LlRouteParams p = good;
    change(p);
    return ll_route_error(p);
  };
  CHECK(with([](LlRouteParams& p) { p.num_tokens = -1; }) != nullptr);
  CHECK(with([](LlRouteParams& p) { p.topk = 0; }) != nullptr);
  CHECK(with([](LlRouteParams& p) { p.topk = kLlMaxTopk + 1; }) != nullptr);
  CHECK(with([](LlRouteParams& p) { p.num_experts = 0; }) != nullptr);
  CHECK(with([](LlRouteParams& p) { p.threads = 48; }) != nullptr);
  CHECK(with([](LlRouteParams& p) { p.threads = 2048; }) != nullptr);
}

TEST_CASE(
    "ll_combine_routed: each token reduces the rows sent back where its dispatch placed them") {
  // The rows each rank sends back are laid out as the host protocol sends its messages: by local
  // expert, then selection order. The expected table is built here that way, message by
  // message, and reduced by ll_combine_token; the twin must find the same rows from the routing.
  std::mt19937_64 rng(20261205);
  constexpr uint32_t kHidden = 128;
  for (int round = 0; round < 60; ++round) {
    const int ranks = std::uniform_int_distribution<int>(1, 6)(rng);
    const int32_t local = std::uniform_int_distribution<int32_t>(1, 5)(rng);
    const int32_t experts = ranks * local;
    const int64_t tokens = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int topk = std::uniform_int_distribution<int>(1, kLlMaxTopk)(rng);
    std::uniform_int_distribution<int64_t> any(-1, experts - 1);
    std::vector<int64_t> idx(static_cast<size_t>(tokens * topk));
    for (int64_t& e : idx)
      e = any(rng);
    std::vector<float> weights(idx.size());
    for (float& w : weights)
      w = std::uniform_real_distribution<float>(-1, 1)(rng);

    // Each rank's rows back, and the row of every selection, message by message.
    std::vector<std::vector<uint16_t>> back(static_cast<size_t>(ranks));
    std::vector<const uint16_t*> want_rows(idx.size(), nullptr);
    std::vector<int64_t> message_of(idx.size(), -1);
    for (int d = 0; d < ranks; ++d) {
      int64_t m = 0;
      for (int32_t le = 0; le < local; ++le)
        for (size_t i = 0; i < idx.size(); ++i)
          if (idx[i] == d * local + le) message_of[i] = m++;
      back[d].resize(static_cast<size_t>(m) * kHidden);
      for (uint16_t& v : back[d])
        v = static_cast<uint16_t>(0x3c00 + rng() % 0x300);  // finite bf16 values
    }
    // Some ranks are masked: their rows are skipped.
    std::vector<const uint16_t*> from(static_cast<size_t>(ranks));
    for (int d = 0; d < ranks; ++d)
      from[d] = rng() % 4 == 0 ? nullptr : back[d].data();
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] < 0 || from[idx[i] / local] == nullptr) continue;
      want_rows[i] = from[idx[i] / local] + message_of[i] * kHidden;
    }
    std::vector<uint16_t> want(static_cast<size_t>(tokens) * kHidden), got(want.size(), 0xffff);
    for (int64_t t = 0; t < tokens; ++t)
      ll_combine_token(want_rows.data() + t * topk, weights.data() + t * topk, topk, kHidden,
                       want.data() + t * kHidden, HostLanes{});

    const Routed r = route(idx, tokens, topk, experts);
    const LlCombineRoutedParams p{.topk_idx = idx.data(),
                                  .positions = r.positions.data(),
                                  .counts = r.counts.data(),
                                  .from = from.data(),
                                  .weights = weights.data(),
                                  .out = got.data(),
                                  .num_tokens = tokens,
                                  .topk = topk,
                                  .num_experts = experts,
                                  .local_experts = local,
                                  .hidden = kHidden};
    REQUIRE(ll_combine_routed_error(p) == nullptr);
    for (size_t i = 0; i < idx.size(); ++i)
      REQUIRE(ll_routed_row(p, static_cast<int64_t>(i)) == want_rows[i]);
    ll_combine_routed_on_host(p);
    REQUIRE(got == want);
  }
}

TEST_CASE("ll_combine_routed and count_mismatches: sizes a kernel cannot take are refused") {
  const LlCombineRoutedParams good{
      .num_tokens = 4, .topk = 2, .num_experts = 8, .local_experts = 2, .hidden = 256};
  CHECK(ll_combine_routed_error(good) == nullptr);
  auto with = [&](auto change) {
    LlCombineRoutedParams p = good;
    change(p);
    return ll_combine_routed_error(p);
  };
  CHECK(with([](LlCombineRoutedParams& p) { p.hidden = 100; }) != nullptr);
  CHECK(with([](LlCombineRoutedParams& p) { p.local_experts = 3; }) != nullptr);
  CHECK(with([](LlCombineRoutedParams& p) { p.local_experts = 0; }) != nullptr);
  CHECK(with([](LlCombineRoutedParams& p) { p.topk = 0; }) != nullptr);
  CHECK(with([](LlCombineRoutedParams& p) { p.threads = 40; }) != nullptr);
  CHECK(mismatch_error({.count = 0}) == nullptr);
  CHECK(mismatch_error({.count = -1}) != nullptr);
  CHECK(mismatch_error({.count = 3, .threads = 1056}) != nullptr);
}

TEST_CASE("count_mismatches: the number of elements that differ") {
  const std::vector<int64_t> a = {3, -1, 7, 7, 0, 12}, b = {3, 2, 7, 6, 0, -1};
  int32_t mismatches = -5;
  count_mismatches_on_host({.a = a.data(), .b = b.data(), .count = 6, .mismatches = &mismatches});
  CHECK(mismatches == 3);
  count_mismatches_on_host({.a = a.data(), .b = a.data(), .count = 6, .mismatches = &mismatches});
  CHECK(mismatches == 0);
  count_mismatches_on_host({.a = nullptr, .b = nullptr, .count = 0, .mismatches = &mismatches});
  CHECK(mismatches == 0);
}
