// The low-latency routing rule's CPU twin (gpu_side/ep/ll_route.hpp) against the rule as written
// (a position is the number of earlier selections of the same expert, counted one by one), on
// random routings with drops, repeated experts within a token and hot experts, and on a case
// worked by hand; bad values are counted, never placed; bad sizes are refused.
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
