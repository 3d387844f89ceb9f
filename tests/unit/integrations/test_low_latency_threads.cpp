// Low-latency calls with ranks as threads of this process (a real TCP bootstrap on loopback, real
// shared arenas, a real fabric with the reorder shim), so that ThreadSanitizer (the tsan preset)
// sees the background send phases of hooks and async_finish against the calls that follow them:
// two dispatches in flight with hooks called out of order, an async combine, a hooked combine,
// every output checked exactly against gpu_side/ep/ll_reference.hpp.
#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

namespace ep = proxyep::gpu_side::ep;
using namespace proxyep;

namespace {

constexpr int kRanks = 2;
constexpr int kTokens = 16;
constexpr int kHidden = 512;
constexpr int kLocal = 2;  // experts per rank

std::vector<ep::RankInputs> inputs(uint64_t seed) {
  ep::WorkloadOptions w;
  w.shape = {kRanks, 1, kLocal * kRanks};
  w.num_tokens = kTokens;
  w.hidden = kHidden;
  w.topk = 2;
  w.drop_fraction = 0.1;
  w.seed = seed;
  std::vector<ep::RankInputs> all;
  for (int r = 0; r < kRanks; ++r)
    all.push_back(ep::make_rank_inputs(w, r));
  return all;
}

uint16_t expert_value(int64_t expert, int home, int64_t token, int64_t c) {
  return ep::float_to_bf16(static_cast<float>((expert * 5 + home * 3 + token + c) % 17) / 8.0f);
}

void check_dispatch(const LowLatencyDispatchResult& d, const std::vector<ep::RankInputs>& all,
                    int me) {
  std::vector<ep::LlRankInputs> views;
  for (const auto& r : all)
    views.push_back({r.x, r.topk_idx, r.topk_weights});
  const std::string error = ep::check_ll_dispatch(
      views, {kRanks, 1, kLocal * kRanks}, kTokens, {.hidden = kHidden, .fp8 = true}, me,
      {d.recv_x, d.recv_x_scales, d.recv_count, d.handle.src_info, d.handle.layout_range});
  require(error.empty(), "test", "dispatch: {}", error);
}

// The expert outputs for `d`'s received rows.
ep::Tensor expert_outputs(const LowLatencyDispatchResult& d, int me) {
  const int64_t rows = int64_t{kRanks} * kTokens;
  ep::Tensor x = ep::Tensor::zeros(ep::DType::bf16, kLocal * rows, kHidden);
  for (int e = 0; e < kLocal; ++e)
    for (int s = 0; s < kRanks; ++s) {
      const int64_t range = d.handle.layout_range.data<int64_t>()[e * kRanks + s];
      for (int64_t i = range >> 32; i < (range >> 32) + (range & 0xffffffff); ++i) {
        const int64_t token = d.handle.src_info.data<int32_t>()[e * rows + i];
        for (int64_t c = 0; c < kHidden; ++c)
          x.data<uint16_t>()[(e * rows + i) * kHidden + c] =
              expert_value(int64_t{me} * kLocal + e, s, token, c);
      }
    }
  return x;
}

void check_combine(const ep::Tensor& got, const ep::RankInputs& mine, int me) {
  std::vector<uint16_t> row(kHidden);
  const ep::Tensor want = ep::reference_ll_combine(
      mine.topk_idx, mine.topk_weights, kHidden, me, [&](int64_t expert, int home, int64_t token) {
        for (int64_t c = 0; c < kHidden; ++c)
          row[c] = expert_value(expert, home, token, c);
        return row.data();
      });
  require(got.bytes() == want.bytes() && std::memcmp(got.raw(), want.raw(), want.bytes()) == 0,
          "test", "combine differs from the reference");
}

LowLatencyCombineArgs combine_args(const LowLatencyDispatchResult& d, const ep::RankInputs& mine,
                                   const ep::Tensor& x) {
  LowLatencyCombineArgs a;
  a.x = x;
  a.topk_idx = mine.topk_idx;
  a.topk_weights = mine.topk_weights;
  a.handle = &d.handle;
  return a;
}

void run_rank(int per_node, control::Bootstrap::Options options) {
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  BufferOptions o;
  o.low_latency_mode = true;
  o.ranks_per_node = per_node;
  o.num_rdma_bytes =
      Buffer::get_low_latency_rdma_size_hint(kTokens, kHidden, kRanks, kLocal * kRanks);
  Buffer buffer(*boot, o);
  for (uint64_t round = 0; round < 3; ++round) {
    const auto a = inputs(2 * round + 1), b = inputs(2 * round + 2);
    auto args = [&](const ep::RankInputs& in) {
      LowLatencyDispatchArgs x;
      x.x = in.x;
      x.topk_idx = in.topk_idx;
      x.num_max_dispatch_tokens_per_rank = kTokens;
      x.num_experts = kLocal * kRanks;
      x.return_recv_hook = true;
      return x;
    };
    LowLatencyDispatchResult da = buffer.low_latency_dispatch(args(a[me]));
    LowLatencyDispatchResult db = buffer.low_latency_dispatch(args(b[me]));
    db.hook();
    da.hook();
    check_dispatch(da, a, me);
    check_dispatch(db, b, me);
    const ep::Tensor xa = expert_outputs(da, me), xb = expert_outputs(db, me);
    LowLatencyCombineArgs ca = combine_args(da, a[me], xa), cb = combine_args(db, b[me], xb);
    ca.async_finish = true;
    cb.return_recv_hook = true;
    LowLatencyCombineResult ra = buffer.low_latency_combine(ca);
    LowLatencyCombineResult rb = buffer.low_latency_combine(cb);  // waits for ra's background work
    rb.hook();
    ra.event.wait();
    check_combine(ra.combined_x, a[me], me);
    check_combine(rb.combined_x, b[me], me);
  }
  if (per_node == 1)
    require(buffer.stats().reordered_completions.has_value(), "test",
            "the fabric path ran without the reorder shim");
  buffer.destroy();
}

void run(int per_node, bool fabric) {
  integrations::testing::run_buffer_ranks(
      kRanks, fabric,
      [per_node](control::Bootstrap::Options options) { run_rank(per_node, options); });
}

}  // namespace

TEST_CASE("low-latency hooks and async calls: node peers (ranks as threads)") {
  run(kRanks, false);
}

TEST_CASE("low-latency hooks and async calls: over the fabric with the reorder shim") {
  run(1, true);
}
