// Low-latency calls with ranks as threads of this process (a real TCP bootstrap on loopback, real
// shared arenas, a real fabric with the reorder shim), so that ThreadSanitizer (the tsan preset)
// sees the background send phases of hooks and async_finish against the calls that follow them:
// two dispatches in flight with hooks called out of order, an async combine, a hooked combine,
// every output checked exactly against gpu_side/ep/ll_reference.hpp.
#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"
#include "tests/unit/integrations/ll_case_checks.hpp"

#include <doctest/doctest.h>

namespace ep = proxyep::gpu_side::ep;
using namespace proxyep;
using namespace proxyep::integrations::testing::ll;

namespace {

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
