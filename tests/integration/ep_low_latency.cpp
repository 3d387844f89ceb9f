// Multi-process test of proxyep::Buffer's low-latency mode (run under `proxyep launch`, exit 0 =
// pass). Every rank generates every rank's inputs from the shared seed (gpu_side/ep/workload.hpp)
// and checks its outputs exactly: dispatch with gpu_side/ep/ll_reference.hpp's checker (DeepEP's
// LL checks made exact: counts, per-block membership by source rank, source info, layout
// ranges, FP8 bytes and scales bit for bit), combine against reference_ll_combine. Cases: FP8,
// round_scale, UE8M0 and BF16; -1 entries; a rank with no tokens and T' below the maximum;
// hooks, async_finish, two calls in flight and a third refused; zero copy and `out=`; the
// statistics tensors; normal -> LL -> normal on one Buffer.
//
// --bad-input: invalid calls first (each must throw before anything is sent), a shape that
// differs between ranks (every rank must fail), then valid calls. --die-rank R: rank R leaves
// before its second dispatch; the others must fail naming it.
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "death_stamp.hpp"
#include "ep_test_options.hpp"
#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "reorder_check.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

using namespace proxyep;

namespace {

constexpr const char* kProgram = "ep_low_latency";

struct Options : testing::EpTestOptions {
  bool shrink = false;  // enable_shrink: the survivors of --die-rank mask it and carry on
  int silent_ms = 0;    // with --shrink: --die-rank sleeps this long (alive, silent), then leaves
  bool no_destroy = false;  // end with the Buffer's destructor (no barrier) instead of destroy()
  bool no_nvlink = false;   // allow_nvlink_for_low_latency_mode = false
  // With --shrink: --die-rank dies by SIGKILL while the others are in a call (not by exit);
  // it writes the moment (CLOCK_MONOTONIC ns) to death_stamp first, and the survivors' first call
  // after it must have masked it within mask_within_ms of that moment.
  bool kill = false;
  std::string death_stamp;
  int mask_within_ms = 0;
  int cases = 0;  // with --shrink: run only the first this many cases after the loss (0: all)
};

// The sizes the Buffer is made for (every case fits them).
constexpr int kMaxTokens = 48;
constexpr int kHidden = 1024;
constexpr int kExpertsPerRank = 4;

template <typename... Args>
void check(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) fail(kProgram, format, std::forward<Args>(args)...);
}

struct Case {
  std::string name;
  bool fp8 = true, round_scale = false, ue8m0 = false;
  bool hook = false, async = false;
  bool zero_copy = false, out = false;
  double drop = 0.1;
  bool uneven = false;  // the last rank has no tokens, rank 0 fewer than the maximum
};

std::vector<Case> cases() {
  return {
      {.name = "fp8"},
      {.name = "bf16", .fp8 = false},
      {.name = "fp8 round_scale", .round_scale = true},
      {.name = "fp8 ue8m0 hook", .round_scale = true, .ue8m0 = true, .hook = true},
      {.name = "bf16 hook zero_copy", .fp8 = false, .hook = true, .zero_copy = true},
      {.name = "fp8 async out", .async = true, .out = true},
      {.name = "fp8 uneven, many -1", .drop = 0.5, .uneven = true},
      {.name = "bf16 uneven hook out", .fp8 = false, .hook = true, .out = true, .uneven = true},
  };
}

struct Inputs {
  std::vector<ep::RankInputs> ranks;
  std::vector<ep::LlRankInputs> views;  // what the checks expect each rank to have sent
  int masked = -1;  // a rank masked (enable_shrink): it sends nothing, its experts' rows skipped
};

Inputs make_inputs(const Case& c, int R, uint64_t seed, int masked = -1) {
  ep::WorkloadOptions w;
  w.shape = {R, 1, kExpertsPerRank * R};
  w.num_tokens = kMaxTokens;
  if (c.uneven) {
    w.tokens_per_rank.assign(static_cast<size_t>(R), kMaxTokens);
    w.tokens_per_rank[0] = kMaxTokens - 5;
    if (R > 1) w.tokens_per_rank[R - 1] = 0;
  }
  w.hidden = kHidden;
  w.topk = std::min(6, w.shape.num_experts);
  w.drop_fraction = c.drop;
  w.seed = seed;
  Inputs in;
  for (int r = 0; r < R; ++r)
    in.ranks.push_back(ep::make_rank_inputs(w, r));
  for (const auto& r : in.ranks)
    in.views.push_back({r.x, r.topk_idx, r.topk_weights});
  in.masked = masked;
  if (masked >= 0) {
    const ep::RankInputs& m = in.ranks[static_cast<size_t>(masked)];
    in.views[static_cast<size_t>(masked)] = {
        ep::TensorRef::matrix(m.x.raw(), ep::DType::bf16, 0, kHidden),
        ep::TensorRef::matrix(m.topk_idx.raw(), ep::DType::i64, 0, m.topk_idx.cols()),
        ep::TensorRef::matrix(m.topk_weights.raw(), ep::DType::f32, 0, m.topk_weights.cols())};
  }
  return in;
}

// Expert `expert`'s output for token `token` of `home`: distinct per triple, exact in bf16.
uint16_t expert_value(int64_t expert, int home, int64_t token, int64_t c) {
  const int v = static_cast<int>((expert * 7 + home * 13 + token * 3 + c) % 64) - 32;
  return ep::float_to_bf16(static_cast<float>(v) / 16.0f);
}

// Fills the combine input [E_local * R*T, H] from the dispatch outputs: each received row gets
// its expert's output for its (source rank, token).
void fill_expert_outputs(uint16_t* x, const LowLatencyDispatchResult& d, int me, int R) {
  const int64_t rows = static_cast<int64_t>(R) * kMaxTokens;
  for (int e = 0; e < kExpertsPerRank; ++e) {
    const int64_t global = static_cast<int64_t>(me) * kExpertsPerRank + e;
    for (int s = 0; s < R; ++s) {
      const int64_t range = d.handle.layout_range.data<int64_t>()[e * R + s];
      const int64_t begin = range >> 32, count = range & 0xffffffff;
      for (int64_t i = begin; i < begin + count; ++i) {
        const int64_t token = d.handle.src_info.data<int32_t>()[e * rows + i];
        for (int64_t col = 0; col < kHidden; ++col)
          x[(e * rows + i) * kHidden + col] = expert_value(global, s, token, col);
      }
    }
  }
}

void check_dispatch(const LowLatencyDispatchResult& d, const Inputs& in, const Case& c, int me,
                    int R, const std::string& at) {
  const ep::LlFormat format{
      .hidden = kHidden, .fp8 = c.fp8, .round_scale = c.round_scale, .ue8m0 = c.ue8m0};
  ep::LlDispatchOutputs out{d.recv_x, d.recv_x_scales, d.recv_count, d.handle.src_info,
                            d.handle.layout_range};
  const std::string error =
      ep::check_ll_dispatch(in.views, {R, 1, kExpertsPerRank * R}, kMaxTokens, format, me, out);
  check(error.empty(), "{}: dispatch: {}", at, error);
}

void check_combine(const ep::Tensor& got, const Inputs& in, int me, const std::string& at) {
  std::vector<uint16_t> row(kHidden);
  const ep::Tensor want =
      ep::reference_ll_combine(in.ranks[me].topk_idx, in.ranks[me].topk_weights, kHidden, me,
                               [&](int64_t expert, int home, int64_t token) -> const uint16_t* {
                                 if (expert / kExpertsPerRank == in.masked) return nullptr;
                                 for (int64_t col = 0; col < kHidden; ++col)
                                   row[col] = expert_value(expert, home, token, col);
                                 return row.data();
                               });
  check(got.rows() == want.rows() && got.cols() == want.cols(), "{}: combine shape", at);
  for (int64_t i = 0; i < want.numel(); ++i)
    check(got.data<uint16_t>()[i] == want.data<uint16_t>()[i],
          "{}: combine: token {} channel {}: {:#06x}, reference {:#06x}", at, i / kHidden,
          i % kHidden, got.data<uint16_t>()[i], want.data<uint16_t>()[i]);
}

LowLatencyDispatchArgs dispatch_args(const Inputs& in, const Case& c, int me,
                                     ep::Tensor& recv_stats, ep::Tensor& wait_stats) {
  LowLatencyDispatchArgs a;
  a.x = in.ranks[me].x;
  a.topk_idx = in.ranks[me].topk_idx;
  a.num_max_dispatch_tokens_per_rank = kMaxTokens;
  a.num_experts = kExpertsPerRank * static_cast<int>(in.ranks.size());
  a.cumulative_local_expert_recv_stats = recv_stats;
  a.dispatch_wait_recv_cost_stats = wait_stats;
  a.use_fp8 = c.fp8;
  a.round_scale = c.round_scale;
  a.use_ue8m0 = c.ue8m0;
  a.async_finish = c.async;
  a.return_recv_hook = c.hook;
  return a;
}

// A dispatch's outputs kept by the caller while later calls run: the Buffer must not reuse
// their memory (it pools outputs of calls nobody holds any more).
struct Kept {
  Case c;
  std::optional<Inputs> in;
  std::optional<LowLatencyDispatchResult> d;
  std::string at;
};

// One dispatch + combine of `c`, checked; with `keep`, the dispatch's outputs are kept there.
// When a dispatch was called and when it returned (its hook run, its event set).
struct DispatchSpan {
  std::chrono::steady_clock::time_point called, returned;
};

uint64_t case_seed(const Options& o, int index) {
  return o.seed * 1000 + static_cast<uint64_t>(index);
}

// `span` (optional) receives the dispatch's span; `given` (optional): the case's inputs, made
// beforehand with make_inputs(c, R, case_seed(o, index), masked).
void run_case(Buffer& buffer, const Case& c, const Options& o, int index, ep::Tensor& recv_stats,
              std::vector<int64_t>& expected_recv, Kept* keep = nullptr, int masked = -1,
              DispatchSpan* span = nullptr, const Inputs* given = nullptr) {
  const int R = buffer.group_size(), me = buffer.rank();
  const std::string at = fmt::format("case {} ({})", index, c.name);
  const Inputs in = given ? *given : make_inputs(c, R, case_seed(o, index), masked);
  ep::Tensor wait_stats = ep::Tensor::zeros(ep::DType::i64, R);
  if (span) span->called = std::chrono::steady_clock::now();
  LowLatencyDispatchResult d =
      buffer.low_latency_dispatch(dispatch_args(in, c, me, recv_stats, wait_stats));
  check(c.hook == d.hook.defined() && c.async == d.event.defined(), "{}: hook/event", at);
  if (c.hook) d.hook();
  if (c.async) d.event.wait();
  if (span) span->returned = std::chrono::steady_clock::now();
  check_dispatch(d, in, c, me, R, at);
  for (int e = 0; e < kExpertsPerRank; ++e)
    expected_recv[e] += d.recv_count.data<int32_t>()[e];
  for (int e = 0; e < kExpertsPerRank; ++e)
    check(recv_stats.data<int32_t>()[e] == expected_recv[e],
          "{}: cumulative_local_expert_recv_stats[{}] = {}, expected {}", at, e,
          recv_stats.data<int32_t>()[e], expected_recv[e]);
  for (int s = 0; s < R; ++s)
    check(wait_stats.data<int64_t>()[s] >= 0, "{}: negative wait for rank {}", at, s);

  LowLatencyCombineArgs ca;
  ep::Tensor x;
  if (c.zero_copy) {
    ep::Tensor next = buffer.get_next_low_latency_combine_buffer(d.handle);
    fill_expert_outputs(next.data<uint16_t>(), d, me, R);
  } else {
    x = ep::Tensor::zeros(ep::DType::bf16, int64_t{kExpertsPerRank} * R * kMaxTokens, kHidden);
    fill_expert_outputs(x.data<uint16_t>(), d, me, R);
    ca.x = x;
  }
  ca.topk_idx = in.ranks[me].topk_idx;
  ca.topk_weights = in.ranks[me].topk_weights;
  ca.handle = &d.handle;
  ca.zero_copy = c.zero_copy;
  ca.async_finish = c.async;
  ca.return_recv_hook = c.hook;
  ep::Tensor out;
  if (c.out) {
    out = ep::Tensor::zeros(ep::DType::bf16, in.ranks[me].x.rows(), kHidden);
    ca.out = out;
  }
  LowLatencyCombineResult r = buffer.low_latency_combine(ca);
  if (c.hook) r.hook();
  if (c.async) r.event.wait();
  check(c.out != r.combined_x.defined(), "{}: combined_x defined although out= was given", at);
  check_combine(c.out ? out : r.combined_x, in, me, at);
  if (keep != nullptr) *keep = Kept{c, in, std::move(d), at + ", kept"};
}

// Two dispatches in flight before either hook (DeepEP's two micro-batches), then their combines
// in flight too; a third call while two are in flight is refused and changes nothing.
void run_two_in_flight(Buffer& buffer, const Options& o, ep::Tensor& recv_stats,
                       std::vector<int64_t>& expected_recv) {
  const int R = buffer.group_size(), me = buffer.rank();
  const Case c{.name = "two in flight", .hook = true};
  const Inputs a = make_inputs(c, R, o.seed * 7 + 1), b = make_inputs(c, R, o.seed * 7 + 2);
  ep::Tensor wait = ep::Tensor::zeros(ep::DType::i64, R);
  LowLatencyDispatchResult da =
      buffer.low_latency_dispatch(dispatch_args(a, c, me, recv_stats, wait));
  LowLatencyDispatchResult db =
      buffer.low_latency_dispatch(dispatch_args(b, c, me, recv_stats, wait));
  bool refused = false;
  try {
    (void)buffer.low_latency_dispatch(dispatch_args(a, c, me, recv_stats, wait));
  } catch (const Error& e) {
    refused = std::string(e.what()).find("already in flight") != std::string::npos;
  }
  check(refused, "a third low-latency call in flight was not refused");
  bool normal_refused = false;
  try {
    (void)buffer.get_dispatch_layout(a.ranks[me].topk_idx, kExpertsPerRank * R);
    DispatchArgs na;
    na.x = a.ranks[me].x;
    (void)buffer.dispatch(na);
  } catch (const Error& e) {
    normal_refused = std::string(e.what()).find("still in flight") != std::string::npos;
  }
  check(normal_refused, "a normal call with low-latency calls in flight was not refused");
  db.hook();  // out of order: b first
  da.hook();
  check_dispatch(da, a, c, me, R, "two in flight (a)");
  check_dispatch(db, b, c, me, R, "two in flight (b)");
  for (const auto* d : {&da, &db})
    for (int e = 0; e < kExpertsPerRank; ++e)
      expected_recv[e] += d->recv_count.data<int32_t>()[e];
  std::vector<ep::Tensor> xs;
  std::vector<LowLatencyCombineResult> results;
  for (const auto& [d, in] : {std::pair{&da, &a}, std::pair{&db, &b}}) {
    xs.push_back(
        ep::Tensor::zeros(ep::DType::bf16, int64_t{kExpertsPerRank} * R * kMaxTokens, kHidden));
    fill_expert_outputs(xs.back().data<uint16_t>(), *d, me, R);
    LowLatencyCombineArgs ca;
    ca.x = xs.back();
    ca.topk_idx = in->ranks[me].topk_idx;
    ca.topk_weights = in->ranks[me].topk_weights;
    ca.handle = &d->handle;
    ca.return_recv_hook = true;
    results.push_back(buffer.low_latency_combine(ca));
  }
  results[0].hook();
  results[1].hook();
  check_combine(results[0].combined_x, a, me, "two in flight (a)");
  check_combine(results[1].combined_x, b, me, "two in flight (b)");
}

// Normal mode on the same Buffer, checked against the normal-mode reference.
void run_normal(Buffer& buffer, const Options& o, int index) {
  const int R = buffer.group_size(), me = buffer.rank();
  ep::WorkloadOptions w;
  w.shape = {R, buffer.ranks_per_node(), kExpertsPerRank * R};
  w.num_tokens = kMaxTokens;
  w.hidden = kHidden;
  w.topk = 4;
  w.seed = o.seed * 31 + static_cast<uint64_t>(index);
  std::vector<ep::RankInputs> all;
  std::vector<ep::DispatchInputs> views;
  for (int r = 0; r < R; ++r)
    all.push_back(ep::make_rank_inputs(w, r));
  for (const auto& r : all)
    views.push_back({r.x, {}, r.topk_idx, r.topk_weights});
  const ep::RankInputs& mine = all[me];
  DispatchLayout layout = buffer.get_dispatch_layout(mine.topk_idx, w.shape.num_experts);
  DispatchResult d =
      buffer.dispatch(DispatchArgs::routed(mine.x, {}, layout, mine.topk_idx, mine.topk_weights));
  const ep::ReferenceDispatch want = ep::reference_dispatch(views, w.shape, me);
  check(d.recv_x.bytes() == want.recv_x.bytes() &&
            std::memcmp(d.recv_x.raw(), want.recv_x.raw(), want.recv_x.bytes()) == 0,
        "normal dispatch {} on the low-latency Buffer differs from the reference", index);
  CombineArgs ca;
  ca.x = d.recv_x;
  ca.handle = &d.handle;
  CombineResult c = buffer.combine(ca);
  check(c.combined_x.rows() == mine.x.rows(), "normal combine {}: rows", index);
}

// Each call must throw before anything is sent (the peers are not in a call), with `expect` in
// its message; the Buffer stays usable.
void expect_refused(const std::string& expect, const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    check(std::string(e.what()).find(expect) != std::string::npos,
          "refused with the wrong message: {} (expected '{}')", e.what(), expect);
    return;
  }
  fail(kProgram, "an invalid call was accepted (expected '{}')", expect);
}

void run_bad_input(Buffer& buffer, const Options& o) {
  const int R = buffer.group_size(), me = buffer.rank();
  const Case c{.name = "bad input"};
  const Inputs in = make_inputs(c, R, o.seed);
  ep::Tensor stats = ep::Tensor::zeros(ep::DType::i32, kExpertsPerRank);
  ep::Tensor wait = ep::Tensor::zeros(ep::DType::i64, R);
  auto base = [&] { return dispatch_args(in, c, me, stats, wait); };
  expect_refused("more than num_max_dispatch_tokens_per_rank", [&] {
    auto a = base();
    a.num_max_dispatch_tokens_per_rank = kMaxTokens - 10;
    buffer.low_latency_dispatch(a);
  });
  ep::Tensor odd = ep::Tensor::zeros(ep::DType::bf16, kMaxTokens, 1000);
  expect_refused("multiple of 128", [&] {
    auto a = base();
    a.x = odd;
    a.use_fp8 = false;
    buffer.low_latency_dispatch(a);
  });
  ep::Tensor h640 = ep::Tensor::zeros(ep::DType::bf16, kMaxTokens, 640);
  expect_refused("512", [&] {
    auto a = base();
    a.x = h640;
    buffer.low_latency_dispatch(a);
  });
  ep::Tensor wide = ep::Tensor::zeros(ep::DType::i64, kMaxTokens, 12);
  expect_refused("1 <= k <= 11", [&] {
    auto a = base();
    a.topk_idx = wide;
    buffer.low_latency_dispatch(a);
  });
  expect_refused("multiple of the number of ranks", [&] {
    auto a = base();
    a.num_experts = kExpertsPerRank * R + 1;
    buffer.low_latency_dispatch(a);
  });
  expect_refused("use_ue8m0 needs", [&] {
    auto a = base();
    a.use_ue8m0 = true;
    buffer.low_latency_dispatch(a);
  });
  expect_refused("cannot be used together", [&] {
    auto a = base();
    a.async_finish = a.return_recv_hook = true;
    buffer.low_latency_dispatch(a);
  });
  ep::Tensor short_stats = ep::Tensor::zeros(ep::DType::i32, kExpertsPerRank + 1);
  expect_refused("cumulative_local_expert_recv_stats", [&] {
    auto a = base();
    a.cumulative_local_expert_recv_stats = short_stats;
    buffer.low_latency_dispatch(a);
  });
  // The last rank asks for other sizes: every rank must fail, naming it, before any token moves.
  if (R > 1) {
    bool failed = false;
    try {
      auto a = base();
      a.num_max_dispatch_tokens_per_rank = me == R - 1 ? kMaxTokens - 1 : kMaxTokens;
      if (me == R - 1)
        a.x = ep::TensorRef::matrix(in.ranks[me].x.raw(), ep::DType::bf16, kMaxTokens - 1, kHidden);
      if (me == R - 1)
        a.topk_idx = ep::TensorRef::matrix(in.ranks[me].topk_idx.raw(), ep::DType::i64,
                                           kMaxTokens - 1, in.ranks[me].topk_idx.cols());
      buffer.low_latency_dispatch(a);
    } catch (const Error& e) {
      const std::string message = e.what();
      failed =
          message.find("every rank must use the same low-latency sizes") != std::string::npos &&
          message.find(fmt::format("num_max_dispatch_tokens_per_rank {}", kMaxTokens - 1)) !=
              std::string::npos;
      if (!failed) std::fprintf(stderr, "%s: unexpected message: %s\n", kProgram, e.what());
    }
    check(failed, "sizes that differ between ranks were not refused on rank {}", me);
  }
  expect_refused("enable_shrink=True", [&] { buffer.low_latency_update_mask_buffer(0, true); });
  // A combine whose dispatch has not received yet, and one with another routing.
  Case hooked = c;
  hooked.hook = true;
  LowLatencyDispatchResult d =
      buffer.low_latency_dispatch(dispatch_args(in, hooked, me, stats, wait));
  ep::Tensor x =
      ep::Tensor::zeros(ep::DType::bf16, int64_t{kExpertsPerRank} * R * kMaxTokens, kHidden);
  LowLatencyCombineArgs ca;
  ca.x = x;
  ca.topk_idx = in.ranks[me].topk_idx;
  ca.topk_weights = in.ranks[me].topk_weights;
  ca.handle = &d.handle;
  expect_refused("has not received its tokens yet", [&] { buffer.low_latency_combine(ca); });
  d.hook();
  expect_refused("use_logfmt is not supported", [&] {
    auto bad = ca;
    bad.use_logfmt = true;
    buffer.low_latency_combine(bad);
  });
  ep::Tensor other = in.ranks[me].topk_idx.clone();
  if (other.numel() > 0) other.data<int64_t>()[0] = other.data<int64_t>()[0] == 0 ? 1 : 0;
  if (other.numel() > 0)
    expect_refused("differs from the one this handle's dispatch routed by", [&] {
      auto bad = ca;
      bad.topk_idx = other;
      buffer.low_latency_combine(bad);
    });
  // Still usable: a valid dispatch and combine.
  std::vector<int64_t> expected(kExpertsPerRank, 0);
  ep::Tensor fresh = ep::Tensor::zeros(ep::DType::i32, kExpertsPerRank);
  run_case(buffer, cases().front(), o, 0, fresh, expected);
}

// --kill: wait until the others are in their next call, then die by SIGKILL.
[[noreturn]] void die_by_sigkill(const Options& o) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  testing::die_by_sigkill(o.death_stamp, kProgram);
}

// A survivor's first dispatch after the loss: the rank must have been masked within
// o.mask_within_ms of the moment it was both dead and waited for (its death, or the call's
// start when this rank was still busy with the case's inputs then). steady_clock is
// CLOCK_MONOTONIC, one clock for every process of the host.
void check_masked_in_time(const Options& o, int gone, const DispatchSpan& span) {
  const double died = testing::death_seconds(o.death_stamp);
  check(died > 0, "no death stamp in {}", o.death_stamp);
  const double returned = testing::monotonic_seconds(span.returned);
  const double ms = (returned - std::max(died, testing::monotonic_seconds(span.called))) * 1e3;
  fmt::print(stderr,
             "{}: rank {} masked {:.0f} ms after it was killed and waited for ({:.0f} ms after "
             "its death)\n",
             kProgram, gone, ms, (returned - died) * 1e3);
  check(o.mask_within_ms <= 0 || ms <= o.mask_within_ms,
        "rank {} was masked {:.0f} ms after it was killed and waited for; the bound is {} ms", gone,
        ms, o.mask_within_ms);
}

// Rank masking: every rank runs the first case; then rank --die-rank leaves (at once, or after
// --silent-ms of silence); the others must mask it when they notice (its departure, or the
// deadline), finish every later case without it -- checked against the references with that
// rank sending nothing and its experts' rows skipped -- report it masked, and refuse normal
// calls. No collective at the end (one rank is gone): the Buffer goes by its destructor.
int run_shrink(Buffer& buffer, control::Bootstrap& boot, const Options& o) {
  const int R = buffer.group_size(), me = buffer.rank(), gone = o.die_rank;
  check(gone >= 0 && gone < R, "--shrink needs --die-rank");
  ep::Tensor recv_stats = ep::Tensor::zeros(ep::DType::i32, kExpertsPerRank);
  std::vector<int64_t> expected_recv(kExpertsPerRank, 0);
  run_case(buffer, cases().front(), o, 0, recv_stats, expected_recv);
  std::vector<Case> after = cases();
  if (o.cases > 0 && static_cast<size_t>(o.cases) < after.size()) after.resize(o.cases);
  // The survivors make the next case's inputs first, so they all wait in its dispatch when the
  // rank dies (what --mask-within-ms times is the masking, not the slowest rank's inputs).
  const Inputs next = me == gone ? Inputs{} : make_inputs(after.front(), R, case_seed(o, 1), gone);
  // Everyone has all of case 0 before the rank leaves (its last writes could be lost otherwise,
  // and its peers would rightly mask it in case 0 already).
  boot.barrier("ep_low_latency(case 0 done)");
  if (me == gone) {
    if (o.silent_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.silent_ms));
    if (o.kill) die_by_sigkill(o);
    std::fprintf(stderr, "%s: rank %d: leaving (test)\n", kProgram, me);
    ::_exit(0);  // exit code 0 keeps the launcher from stopping the others
  }
  int index = 1;
  for (const Case& c : after) {
    DispatchSpan span;
    run_case(buffer, c, o, index, recv_stats, expected_recv, nullptr, gone, &span,
             index == 1 ? &next : nullptr);
    if (index++ == 1 && !o.death_stamp.empty()) check_masked_in_time(o, gone, span);
  }
  ep::Tensor mask = ep::Tensor::zeros(ep::DType::i32, R);
  buffer.low_latency_query_mask_buffer(mask);
  for (int r = 0; r < R; ++r)
    check(mask.data<int32_t>()[r] == (r == gone ? 1 : 0), "mask of rank {} is {}", r,
          mask.data<int32_t>()[r]);
  expect_refused("ranks are masked", [&] { run_normal(buffer, o, 2); });
  // Unmasked by hand, the rank is still gone: the next call masks it again.
  buffer.low_latency_clean_mask_buffer();
  buffer.low_latency_query_mask_buffer(mask);
  check(mask.data<int32_t>()[gone] == 0, "clean_mask_buffer left rank {} masked", gone);
  run_case(buffer, cases().front(), o, index++, recv_stats, expected_recv, nullptr, gone);
  buffer.low_latency_query_mask_buffer(mask);
  check(mask.data<int32_t>()[gone] == 1, "rank {} was not masked again", gone);
  expect_refused("cannot mask itself", [&] { buffer.low_latency_update_mask_buffer(me, true); });
  if (me == 0)
    fmt::print("{}: {} ranks, rank {} {} and masked: every later case OK without it\n", kProgram, R,
               gone,
               o.kill            ? "was killed"
               : o.silent_ms > 0 ? "went silent"
                                 : "left");
  return 0;
}

int run(const Options& o) {
  testing::set_fabric_params(o);
  auto boot = control::Bootstrap::from_environment();
  const int R = boot->world_size();
  BufferOptions options;
  options.ranks_per_node = o.ranks_per_node;
  options.low_latency_mode = true;
  options.allow_nvlink_for_low_latency_mode = !o.no_nvlink;
  options.enable_shrink = o.shrink;
  options.num_nvl_bytes = Buffer::nvl_bytes_hint(kMaxTokens, kHidden * 2, 8, R);
  options.num_rdma_bytes =
      std::max(Buffer::get_low_latency_rdma_size_hint(kMaxTokens, kHidden, R, kExpertsPerRank * R),
               Buffer::rdma_bytes_hint(kMaxTokens, kHidden * 2, 8, R, 1));
  Buffer buffer(*boot, options);
  check(buffer.low_latency_mode(), "low_latency_mode() is false");
  auto require_reordered = [&] {
    if (o.reorder)
      testing::require_reordered(*boot, buffer.stats().reordered_completions, kProgram);
  };
  if (o.shrink) return run_shrink(buffer, *boot, o);
  if (o.bad_input) {
    run_bad_input(buffer, o);
    require_reordered();
    return 0;
  }
  ep::Tensor recv_stats = ep::Tensor::zeros(ep::DType::i32, kExpertsPerRank);
  std::vector<int64_t> expected_recv(kExpertsPerRank, 0);
  int index = 0;
  run_normal(buffer, o, 0);  // normal -> LL -> normal
  Kept kept;  // the outputs of the case before last, checked again after the next two
  for (const Case& c : cases()) {
    if (index == 1 && boot->rank() == o.die_rank) {
      std::fprintf(stderr, "%s: rank %d: leaving before dispatch (test)\n", kProgram, o.die_rank);
      ::_exit(0);  // exit code 0 keeps the launcher from stopping the others
    }
    Kept next;
    run_case(buffer, c, o, index++, recv_stats, expected_recv, &next);
    if (kept.d) check_dispatch(*kept.d, *kept.in, kept.c, buffer.rank(), R, kept.at);
    if (index % 2 == 0) kept = std::move(next);
  }
  run_two_in_flight(buffer, o, recv_stats, expected_recv);
  run_normal(buffer, o, 1);
  buffer.clean_low_latency_buffer(kMaxTokens, kHidden, kExpertsPerRank * R);
  require_reordered();  // (collective: a barrier, so it comes before the last call)
  // The last call, then straight to teardown: a rank that finished must not leave before the
  // rows its peers still wait for have left it (with --no-destroy, no barrier helps).
  run_case(buffer, cases().front(), o, index++, recv_stats, expected_recv);
  if (!o.no_destroy) buffer.destroy();
  if (boot->rank() == 0)
    fmt::print("{}: {} ranks, {} per node{}, provider {}, reorder {}: all cases OK\n", kProgram, R,
               buffer.ranks_per_node(), o.no_nvlink ? " (no NVLink: all through the fabric)" : "",
               o.provider, o.reorder ? "on" : "off");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"proxyep::Buffer low-latency integration test (run under proxyep launch)"};
  Options o;
  testing::add_ep_test_options(app, o);
  app.add_flag("--no-nvlink", o.no_nvlink, "allow_nvlink_for_low_latency_mode = false");
  app.add_flag("--no-destroy", o.no_destroy, "leave through the destructor, without a barrier");
  app.add_flag("--shrink", o.shrink, "enable_shrink: survivors mask --die-rank and carry on");
  app.add_option("--silent-ms", o.silent_ms,
                 "with --shrink: --die-rank stays silent this long before it leaves");
  app.add_flag("--kill", o.kill, "with --shrink: --die-rank dies by SIGKILL mid-run instead");
  app.add_option("--death-stamp", o.death_stamp,
                 "with --kill: file where the killed rank writes when it died (CLOCK_MONOTONIC)");
  app.add_option("--mask-within-ms", o.mask_within_ms,
                 "with --death-stamp: the survivors must have masked it within this many ms");
  app.add_option("--cases", o.cases, "with --shrink: only the first N cases after the loss");
  return testing::run_ep_test(kProgram, app, argc, argv, [&] { return run(o); });
}
