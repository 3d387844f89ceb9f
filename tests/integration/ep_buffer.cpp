// Multi-process test of proxyep::Buffer (run under `proxyep launch`, exit 0 = pass). Every rank
// generates every rank's inputs from the shared seed (gpu_side/ep/workload.hpp), so it can
// compute the reference (gpu_side/ep/reference.hpp) of what it must receive and of its combine
// output, and compares the Buffer's results with it for exact equality, case after case:
// random routing with -1 entries, every token to one expert, a rank with zero tokens and one
// with a single token, top-k 1..8, hidden 2048..7168, BF16 and FP8, expert alignment, the
// num_worst_tokens variant, cached dispatch, combine with top-k weights and two biases.
//
// With ep.internode=hierarchical (PROXYEP_EP_INTERNODE) on a group across nodes, the rows to other
// nodes must cross once per (token, node) (BufferStats::rows_to_fabric against the layout's
// num_tokens_per_rdma_rank, every call) and combine must follow the reference's by_node order
// bit for bit; every rank's expert output is then its received rows scaled by a rank's own
// factor, so that the order of the sums shows in the bits.
//
// --rdma-chunks S,W: every call passes a Config whose RDMA chunk sizes are S rows per chunk (S + 1
// on odd nodes, so a receiver that planned with its own would misplace rows) and W rows in
// flight; a hierarchical dispatch must send each other node ceil(rows / S) chunks.
//
// --async: every dispatch and combine is made with async_finish and its event waited for later
// (after the next call, which finishes it first, for some); then a combine must return before
// the peers even start theirs (they start after a barrier the caller enters after its call).
//
// --bad-input: every rank makes invalid calls (each must throw before anything is sent), then a
// valid one that must succeed. --die-rank R: rank R leaves (_exit(0)) before its second
// dispatch; the others must fail within PROXYEP_EP_TIMEOUT_MS with an error naming it.
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "death_stamp.hpp"
#include "ep_test_options.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "reorder_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

using namespace proxyep;

namespace {

struct Options : testing::EpTestOptions {
  int die_after_ms = 0;  // with die_rank: it vanishes this long after start, whatever it is doing
  bool small_buffer = false;     // a Buffer that holds a few rows per peer: every call streams
  bool small_chunks = false;     // chunks of ~2 rows through a Buffer that holds the whole call
  bool async = false;            // every call with async_finish
  std::vector<int> rdma_chunks;  // {S, W}: Config's RDMA chunk sizes (S + 1 on odd nodes)
  // --kill: every rank loops small dispatch+combine calls; --die-rank dies by SIGKILL after
  // --die-after-ms, writing the moment to --death-stamp; every survivor must fail on its own,
  // naming that rank, within --fail-within-ms of it, and refuse the next call.
  bool kill = false;
  std::string death_stamp;
  int fail_within_ms = 0;
};

// The Buffer's creation reports its steps in order (BufferStats::setup_steps), the fabric's
// exactly when the group spans nodes; `bench ep` prints them.
void check_setup_steps(const Buffer& buffer) {
  const auto& steps = buffer.stats().setup_steps;
  std::vector<std::string> names;
  for (const auto& step : steps) {
    require(step.seconds >= 0 && step.seconds < 600 && step.cpu_seconds >= 0, "ep_buffer",
            "setup step {} took {} s ({} s CPU)", step.name, step.seconds, step.cpu_seconds);
    names.push_back(step.name);
  }
  const bool spans_nodes = buffer.group_size() > buffer.ranks_per_node();
  std::vector<std::string> want = {"landing region", "options agreed", "node memory"};
  if (spans_nodes && params::proxy_mode.get() == "daemon")
    want.push_back("attached");  // the node daemon opened the fabric and registered
  else if (spans_nodes)
    want.insert(want.end(), {"fabric open", "memory registered"});
  if (spans_nodes)
    want.insert(want.end(),
                {"fabric addresses", "regions shared", "channels", "connections", "proxy started"});
  want.insert(want.end(), {"ready barrier", "modes"});
  require(names == want, "ep_buffer", "setup steps [{}], expected [{}]", fmt::join(names, ", "),
          fmt::join(want, ", "));
}

// --kill (normal mode): see Options. The calls are small and their inputs made once, so every
// survivor is in a call, waiting, when the rank dies.
int run_killed_peer(Buffer& buffer, control::Bootstrap& boot, const Options& o) {
  const int R = buffer.group_size(), me = buffer.rank(), gone = o.die_rank;
  require(gone >= 0 && gone < R && o.die_after_ms > 0, "ep_buffer",
          "--kill needs --die-rank and --die-after-ms");
  ep::WorkloadOptions w;
  w.shape = {R, buffer.ranks_per_node(), 4 * R};
  w.num_tokens = 16;
  w.hidden = 256;
  w.topk = std::min(4, w.shape.num_experts);
  w.seed = o.seed;
  const ep::RankInputs in = ep::make_rank_inputs(w, me);
  boot.barrier("ep_buffer(inputs made)");
  if (me == gone)
    std::thread([&o] {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.die_after_ms));
      testing::die_by_sigkill(o.death_stamp, "ep_buffer");
    }).detach();
  auto call = [&] {
    auto layout = buffer.get_dispatch_layout(in.topk_idx, w.shape.num_experts);
    auto got =
        buffer.dispatch(DispatchArgs::routed(in.x, {}, layout, in.topk_idx, in.topk_weights));
    CombineArgs cargs;
    cargs.x = got.recv_x;
    cargs.handle = &got.handle;
    (void)buffer.combine(cargs);
  };
  int calls = 0;
  try {
    for (;; ++calls)
      call();
  } catch (const Error& first) {
    const auto failed = std::chrono::steady_clock::now();
    const double died = testing::death_seconds(o.death_stamp);
    require(died > 0, "ep_buffer", "a call failed before rank {} died: {}", gone, first.what());
    const double ms = (testing::monotonic_seconds(failed) - died) * 1e3;
    std::fprintf(stderr, "ep_buffer: call %d failed %.0f ms after rank %d was killed: %s\n", calls,
                 ms, gone, first.what());
    require(std::string(first.what()).find(fmt::format("rank {}", gone)) != std::string::npos,
            "ep_buffer", "the failure does not name rank {}: {}", gone, first.what());
    require(o.fail_within_ms <= 0 || ms <= o.fail_within_ms, "ep_buffer",
            "the call failed {:.0f} ms after rank {} was killed; the bound is {} ms", ms, gone,
            o.fail_within_ms);
    try {
      call();
    } catch (const Error& next) {
      // Refused, as it must be: the ranks are out of step. Stay until every survivor has failed
      // on its own (its own failure, not this rank's exit, must be what it names).
      testing::wait_for_survivors(o.death_stamp, me, R - 1, std::chrono::seconds(20));
      return 0;
    }
    fail("ep_buffer", "a call after a failed one was accepted");
  }
}

// The result of a call made with async_finish = `async`, once its event is set.
template <typename Result>
Result finished(Result r) {
  r.event.wait();
  return r;
}

struct Case {
  std::string name;
  ep::Routing routing = ep::Routing::random;
  int tokens = 64;
  int hidden = 2048;
  int topk = 8;
  int experts_per_rank = 8;
  bool fp8 = false;
  double drop = 0.1;
  bool uneven = false;  // last rank has no tokens, rank 0 has one
  int alignment = 1;
  bool ue8m0 = false;  // FP8 scales as int32 packs of four UE8M0 exponents [tokens, hidden / 512]
};

std::vector<Case> cases() {
  return {
      {"random bf16 topk8 hidden2048, -1 entries", ep::Routing::random, 96, 2048, 8, 8, false, 0.15,
       false, 1},
      {"random fp8 topk4 hidden7168", ep::Routing::random, 40, 7168, 4, 4, true, 0.1, false, 4},
      {"every token to one expert, topk1", ep::Routing::one_expert, 50, 4096, 1, 2, false, 0.0,
       false, 1},
      {"zero tokens on a rank, one token on another, topk2", ep::Routing::random, 30, 2560, 2, 6,
       false, 0.0, true, 8},
      {"skewed fp8 topk6 hidden5120", ep::Routing::skewed, 64, 5120, 6, 4, true, 0.05, false, 1},
      {"random bf16 topk3 hidden3072", ep::Routing::random, 80, 3072, 3, 3, false, 0.3, false, 2},
      {"random fp8 UE8M0 scales topk8 hidden7168", ep::Routing::random, 48, 7168, 8, 4, true, 0.1,
       false, 1, true},
  };
}

template <typename... Args>
void check(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) fail("ep_buffer", format, std::forward<Args>(args)...);
}

void expect_equal(const Tensor& got, const Tensor& want, int64_t rows, const std::string& what) {
  check(got.defined() == want.defined(), "{}: defined {} vs reference {}", what, got.defined(),
        want.defined());
  if (!got.defined()) return;
  check(got.dtype() == want.dtype() && got.cols() == want.cols(), "{}: {} vs reference {}", what,
        got.ref().describe(), want.ref().describe());
  check(got.rows() >= rows && want.rows() >= rows, "{}: {} rows, reference {}, comparing {}", what,
        got.rows(), want.rows(), rows);
  size_t row_bytes = static_cast<size_t>(got.cols()) * ep::dtype_size(got.dtype());
  for (int64_t r = 0; r < rows; ++r)
    if (std::memcmp(got.raw() + r * row_bytes, want.raw() + r * row_bytes, row_bytes) != 0)
      fail("ep_buffer", "{}: row {} of {} differs from the reference", what, r, rows);
}

Tensor make_bias(int rank, int which, int64_t tokens, int hidden) {
  Tensor b = Tensor::empty(DType::bf16, tokens, hidden);
  auto* p = b.data<uint16_t>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int i = 0; i < hidden; ++i)
      p[t * hidden + i] = ep::float_to_bf16(
          static_cast<float>((t * 7 + i * 3 + rank * 5 + which * 11) % 17 - 8) * 0.125f);
  return b;
}

// Rank r's expert output for its received rows x: bf16(x * (1 + (r + 1) / 64) + (r + 1) / 32),
// so sums over ranks round differently in a different order.
Tensor expert_output(const Tensor& x, int64_t rows, int r) {
  Tensor y = Tensor::empty(DType::bf16, x.rows(), x.cols());
  const float scale = 1.0f + static_cast<float>(r + 1) / 64.0f, shift = (r + 1) / 32.0f;
  for (int64_t i = 0; i < x.numel(); ++i)
    y.data<uint16_t>()[i] =
        i < rows * x.cols()
            ? ep::float_to_bf16(ep::bf16_to_float(x.data<uint16_t>()[i]) * scale + shift)
            : 0;
  return y;
}

// --rdma-chunks: this rank's Config (DeepEP's rules round W up to a multiple of S).
std::optional<Config> rdma_config(const Options& o, const Buffer& buffer) {
  if (o.rdma_chunks.empty()) return std::nullopt;
  const int node = buffer.rank() / buffer.ranks_per_node();
  return Config::make(20, 6, 256, o.rdma_chunks[0] + node % 2, o.rdma_chunks[1]);
}

void run_case(Buffer& buffer, const Case& c, const Options& o, int call_index) {
  const int R = buffer.group_size(), me = buffer.rank();
  const bool hierarchical = buffer.stats().internode == "hierarchical";
  const uint64_t fabric_rows_before = buffer.stats().rows_to_fabric;
  const uint64_t fabric_chunks_before = buffer.stats().chunks_to_fabric;
  const std::optional<Config> config = rdma_config(o, buffer);
  ep::WorkloadOptions w;
  // At least top-k experts in all (a single rank may hold fewer than a case's top-k).
  const int experts = std::max(c.experts_per_rank * R, (c.topk + R - 1) / R * R);
  w.shape = {R, buffer.ranks_per_node(), experts};
  w.num_tokens = c.tokens;
  if (c.uneven) {
    w.tokens_per_rank.assign(static_cast<size_t>(R), c.tokens);
    w.tokens_per_rank[0] = 1;
    w.tokens_per_rank[static_cast<size_t>(R - 1)] = 0;
  }
  w.hidden = c.hidden;
  w.topk = c.topk;
  w.routing = c.routing;
  w.drop_fraction = c.drop;
  w.fp8 = c.fp8;
  w.ue8m0 = c.ue8m0;
  w.seed = o.seed * 1000 + static_cast<uint64_t>(call_index);
  std::vector<ep::RankInputs> inputs;
  std::vector<ep::DispatchInputs> views;
  for (int r = 0; r < R; ++r)
    inputs.push_back(ep::make_rank_inputs(w, r));
  for (int r = 0; r < R; ++r) {
    const auto& in = inputs[static_cast<size_t>(r)];
    views.push_back({c.fp8 ? in.x_fp8.ref() : in.x.ref(), c.fp8 ? in.x_scales.ref() : TensorRef{},
                     in.topk_idx.ref(), in.topk_weights.ref()});
  }
  const auto& mine = inputs[static_cast<size_t>(me)];
  const int64_t tokens = mine.topk_idx.rows();
  const std::string at = fmt::format("case '{}' rank {}", c.name, me);

  auto layout = buffer.get_dispatch_layout(mine.topk_idx, w.shape.num_experts);
  // num_tokens_per_rdma_rank given: checked across nodes.
  DispatchArgs args = DispatchArgs::routed(views[static_cast<size_t>(me)].x,
                                           views[static_cast<size_t>(me)].x_scales, layout,
                                           mine.topk_idx, mine.topk_weights);
  args.expert_alignment = c.alignment;
  args.async_finish = o.async;
  args.config = config;
  auto got = buffer.dispatch(args);
  auto want = ep::reference_dispatch(views, w.shape, me, c.alignment);
  {
    // Hierarchical: each token once per other node that holds one of its experts; per_rank:
    // once per rank of another node it reaches.
    got.event.wait();
    const int own_node = me / w.shape.ranks_per_node;
    uint64_t expected = 0;
    if (hierarchical) {
      check(layout.num_tokens_per_rdma_rank.defined(),
            "{}: no num_tokens_per_rdma_rank across nodes", at);
      for (int n = 0; n < w.shape.num_nodes(); ++n)
        if (n != own_node)
          expected += static_cast<uint64_t>(layout.num_tokens_per_rdma_rank.data<int32_t>()[n]);
    } else {
      for (int r = 0; r < R; ++r)
        if (r / w.shape.ranks_per_node != own_node)
          expected += static_cast<uint64_t>(layout.num_tokens_per_rank.data<int32_t>()[r]);
    }
    const uint64_t sent = buffer.stats().rows_to_fabric - fabric_rows_before;
    check(sent == expected, "{}: {} rows crossed to other nodes, expected {} ({})", at, sent,
          expected, buffer.stats().internode);
    if (hierarchical && config) {
      // Every forwarder row crosses in chunks (no eager rows between nodes) of the Config's size.
      const auto send = static_cast<uint64_t>(config->num_max_rdma_chunked_send_tokens);
      uint64_t chunks = 0;
      for (int n = 0; n < w.shape.num_nodes(); ++n)
        if (n != own_node)
          chunks += (static_cast<uint64_t>(layout.num_tokens_per_rdma_rank.data<int32_t>()[n]) +
                     send - 1) /
                    send;
      const uint64_t posted = buffer.stats().chunks_to_fabric - fabric_chunks_before;
      check(posted == chunks, "{}: {} chunks to other nodes, expected {} of at most {} rows", at,
            posted, chunks, send);
    }
  }

  // num_worst_tokens: same rows first, then -1 indices; no per-expert list.
  DispatchArgs worst = args;
  worst.num_worst_tokens = static_cast<int>(std::max<int64_t>(1, w.num_tokens) * R);
  // With --async, this call first finishes the one before (stream order), whose event is then
  // already set.
  auto padded = finished(buffer.dispatch(worst));
  got.event.wait();
  const int64_t recv = want.recv_src_idx.rows();
  check(got.handle.num_recv_tokens == recv, "{}: received {} rows, reference {}", at,
        got.handle.num_recv_tokens, recv);
  expect_equal(got.recv_x, want.recv_x, recv, at + " recv_x");
  if (c.fp8) expect_equal(got.recv_x_scales, want.recv_x_scales, recv, at + " recv_x_scales");
  expect_equal(got.recv_topk_idx, want.recv_topk_idx, recv, at + " recv_topk_idx");
  expect_equal(got.recv_topk_weights, want.recv_topk_weights, recv, at + " recv_topk_weights");
  expect_equal(got.handle.recv_src_idx, want.recv_src_idx, recv, at + " recv_src_idx");
  check(got.num_recv_tokens_per_expert == want.num_recv_tokens_per_expert,
        "{}: num_recv_tokens_per_expert {} vs reference {}", at,
        fmt::format("{}", fmt::join(got.num_recv_tokens_per_expert, ",")),
        fmt::format("{}", fmt::join(want.num_recv_tokens_per_expert, ",")));

  check(padded.recv_x.rows() == worst.num_worst_tokens && padded.num_recv_tokens_per_expert.empty(),
        "{}: num_worst_tokens gave {} rows and a list of {}", at, padded.recv_x.rows(),
        padded.num_recv_tokens_per_expert.size());
  expect_equal(padded.recv_x, want.recv_x, recv, at + " recv_x (num_worst_tokens)");
  expect_equal(padded.recv_topk_idx, want.recv_topk_idx, recv, at + " recv_topk_idx (worst)");
  for (int64_t i = recv * c.topk; i < padded.recv_topk_idx.numel(); ++i)
    check(padded.recv_topk_idx.data<int64_t>()[i] == -1, "{}: tail index {} is not -1", at, i);

  // Cached dispatch of the same routing reproduces the rows.
  DispatchArgs again;
  again.x = args.x;
  again.x_scales = args.x_scales;
  again.handle = &got.handle;
  again.async_finish = o.async;
  again.config = config;
  auto cached = finished(buffer.dispatch(again));
  expect_equal(cached.recv_x, want.recv_x, recv, at + " recv_x (cached)");
  check(!cached.recv_topk_idx.defined(), "{}: cached dispatch returned topk", at);

  // Combine: every rank feeds back its received rows (as bf16), plus weights and two biases.
  std::vector<ep::ReferenceDispatch> dispatched;
  std::vector<TensorRef> expert_out, weights_in;
  std::vector<ep::DispatchInputs> bf16_views = views;
  for (int r = 0; r < R; ++r)
    bf16_views[static_cast<size_t>(r)].x = inputs[static_cast<size_t>(r)].x.ref(),
    bf16_views[static_cast<size_t>(r)].x_scales = {};
  for (int r = 0; r < R; ++r)
    dispatched.push_back(ep::reference_dispatch(bf16_views, w.shape, r));
  std::vector<Tensor> outputs;
  for (int r = 0; r < R; ++r) {
    const ep::ReferenceDispatch& d = dispatched[static_cast<size_t>(r)];
    outputs.push_back(expert_output(d.recv_x, d.recv_x.rows(), r));
  }
  for (int r = 0; r < R; ++r) {
    expert_out.push_back(outputs[static_cast<size_t>(r)].ref());
    weights_in.push_back(dispatched[static_cast<size_t>(r)].recv_topk_weights.ref());
  }
  const ep::CombineOrder order =
      hierarchical ? ep::CombineOrder::by_node : ep::CombineOrder::by_rank;
  DispatchResult bf16_got = got;
  if (c.fp8) {
    DispatchArgs plain = again;
    plain.x = mine.x;
    plain.x_scales = {};
    bf16_got = finished(buffer.dispatch(plain));
    bf16_got.handle = got.handle;
    bf16_got.recv_topk_weights = got.recv_topk_weights;
  }
  Tensor b0 = make_bias(me, 0, tokens, c.hidden), b1 = make_bias(me, 1, tokens, c.hidden);
  const Tensor y = expert_output(bf16_got.recv_x, recv, me);
  CombineArgs cargs;
  cargs.x = y;
  cargs.handle = &got.handle;
  cargs.topk_weights = got.recv_topk_weights;
  cargs.bias0 = b0;
  cargs.bias1 = b1;
  cargs.async_finish = o.async;
  cargs.config = config;
  auto combined = finished(buffer.combine(cargs));
  auto want_c = ep::reference_combine(expert_out, dispatched, weights_in, w.shape, me,
                                      static_cast<int>(tokens), b0, b1, order);
  expect_equal(combined.combined_x, want_c.combined_x, tokens, at + " combined_x");
  expect_equal(combined.combined_topk_weights, want_c.combined_topk_weights, tokens,
               at + " combined_topk_weights");
  // And without weights or biases.
  auto bare = finished(
      buffer.combine({.x = y, .handle = &got.handle, .config = config, .async_finish = o.async}));
  auto want_bare = ep::reference_combine(expert_out, dispatched, {}, w.shape, me,
                                         static_cast<int>(tokens), {}, {}, order);
  expect_equal(bare.combined_x, want_bare.combined_x, tokens, at + " combined_x (no bias)");
  if (me == 0) fmt::print("ep_buffer: {}: OK ({} rows received on rank 0)\n", c.name, recv);
}

// An async combine returns before the peers start theirs: even ranks call it and then enter a
// barrier that odd ranks enter before their (synchronous) combine. Were the combine not finished
// on the communication thread, the even ranks would wait in it for records the odd ranks send
// only after the barrier: a timeout naming them. The result must equal a synchronous combine's.
void run_overlap(Buffer& buffer, control::Bootstrap& boot) {
  const int R = buffer.group_size(), me = buffer.rank();
  ep::WorkloadOptions w;
  w.shape = {R, buffer.ranks_per_node(), 4 * R};
  w.num_tokens = 64;
  w.hidden = 2048;
  w.topk = 4;
  w.seed = 77;
  const ep::RankInputs mine = ep::make_rank_inputs(w, me);
  auto layout = buffer.get_dispatch_layout(mine.topk_idx, w.shape.num_experts);
  auto d = buffer.dispatch({.x = mine.x,
                            .num_tokens_per_rank = layout.num_tokens_per_rank,
                            .is_token_in_rank = layout.is_token_in_rank,
                            .num_tokens_per_expert = layout.num_tokens_per_expert,
                            .topk_idx = mine.topk_idx,
                            .topk_weights = mine.topk_weights});
  const bool early = me % 2 == 0;
  CombineResult combined;
  if (early) {
    combined = buffer.combine({.x = d.recv_x, .handle = &d.handle, .async_finish = true});
    boot.barrier("ep_buffer(overlap)");
    combined.event.wait();
  } else {
    boot.barrier("ep_buffer(overlap)");
    combined = buffer.combine({.x = d.recv_x, .handle = &d.handle});
  }
  auto again = buffer.combine({.x = d.recv_x, .handle = &d.handle});
  expect_equal(combined.combined_x, again.combined_x, d.handle.num_tokens,
               fmt::format("rank {} async combine (overlap)", me));
  if (me == 0) fmt::print("ep_buffer: async combine returned before its peers started: OK\n");
}

// Each bad call must throw on this rank before anything is sent; the next valid call works.
void run_bad_input(Buffer& buffer, const Options& o) {
  const int R = buffer.group_size(), me = buffer.rank();
  ep::WorkloadOptions w;
  w.shape = {R, buffer.ranks_per_node(), 4 * R};
  w.num_tokens = 16;
  w.hidden = 256;
  w.topk = 2;
  w.seed = o.seed;
  auto in = ep::make_rank_inputs(w, me);
  auto layout = buffer.get_dispatch_layout(in.topk_idx, w.shape.num_experts);
  DispatchArgs good{.x = in.x,
                    .num_tokens_per_rank = layout.num_tokens_per_rank,
                    .num_tokens_per_rdma_rank = layout.num_tokens_per_rdma_rank,
                    .is_token_in_rank = layout.is_token_in_rank,
                    .num_tokens_per_expert = layout.num_tokens_per_expert,
                    .topk_idx = in.topk_idx,
                    .topk_weights = in.topk_weights};
  auto expect_throw = [&](const std::string& what, const std::string& needle, auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      check(std::string(e.what()).find(needle) != std::string::npos,
            "bad input '{}': the error does not mention '{}': {}", what, needle, e.what());
      if (me == 0) fmt::print("ep_buffer: rejected {}: {}\n", what, e.what());
      return;
    }
    fail("ep_buffer", "bad input '{}' was accepted", what);
  };
  Tensor idx = in.topk_idx.clone();
  idx.data<int64_t>()[3] = w.shape.num_experts;  // one past the last expert
  expect_throw("topk_idx >= num_experts", "topk_idx",
               [&] { (void)buffer.get_dispatch_layout(idx, w.shape.num_experts); });
  DispatchArgs bad = good;
  bad.topk_idx = idx;
  expect_throw("dispatch with topk_idx >= num_experts", "topk_idx",
               [&] { (void)buffer.dispatch(bad); });
  idx.data<int64_t>()[3] = -2;
  expect_throw("topk_idx < -1", "topk_idx", [&] { (void)buffer.dispatch(bad); });
  if (layout.num_tokens_per_rdma_rank.defined()) {
    // Across nodes: the per-node counts, when given, must be is_token_in_rank's.
    Tensor per_node = layout.num_tokens_per_rdma_rank.clone();
    per_node.data<int32_t>()[0] += 1;
    bad = good;
    bad.num_tokens_per_rdma_rank = per_node;
    expect_throw("num_tokens_per_rdma_rank off by one", "num_tokens_per_rdma_rank[0]",
                 [&] { (void)buffer.dispatch(bad); });
  }
  Tensor as_float = Tensor::zeros(DType::f32, in.x.rows(), in.x.cols());
  bad = good;
  bad.x = as_float;
  expect_throw("x of the wrong dtype", "bf16", [&] { (void)buffer.dispatch(bad); });
  bad = good;
  bad.x = TensorRef::matrix(in.x.raw(), DType::bf16, in.x.rows() / 2, in.x.cols() * 2);
  expect_throw("x of the wrong shape", "shape", [&] { (void)buffer.dispatch(bad); });
  Tensor odd = Tensor::zeros(DType::bf16, in.x.rows(), 12);  // 24 bytes per row
  bad = good;
  bad.x = odd;
  expect_throw("hidden not a multiple of 16 bytes", "16 bytes",
               [&] { (void)buffer.dispatch(bad); });
  Tensor per_expert = Tensor::zeros(DType::i32, w.shape.num_experts + 1);
  bad = good;
  bad.num_tokens_per_expert = per_expert;
  expect_throw("num_experts not divisible by ranks", "multiple of the number of ranks",
               [&] { (void)buffer.dispatch(bad); });
  expect_throw("layout with num_experts not divisible by ranks", "multiple of num_ranks",
               [&] { (void)buffer.get_dispatch_layout(in.topk_idx, w.shape.num_experts + 1); });
  // A row wider than the Buffer's slots (sized for rows of hidden 256).
  Tensor wide = Tensor::zeros(DType::bf16, in.x.rows(), 32768);
  bad = good;
  bad.x = wide;
  expect_throw("a row wider than the Buffer was sized for", "does not fit",
               [&] { (void)buffer.dispatch(bad); });
  // A Config filled by hand whose RDMA chunks are larger than what may be in flight.
  Config chunks;
  chunks.num_max_rdma_chunked_send_tokens = 10;
  chunks.num_max_rdma_chunked_recv_tokens = 4;
  bad = good;
  bad.config = chunks;
  expect_throw("RDMA chunks above the rows in flight", "num_max_rdma_chunked_send_tokens (10)",
               [&] { (void)buffer.dispatch(bad); });
  // The Buffer is still usable.
  auto ok = buffer.dispatch(good);
  expect_throw("a combine with the same Config", "num_max_rdma_chunked_recv_tokens (4)", [&] {
    (void)buffer.combine({.x = ok.recv_x, .handle = &ok.handle, .config = chunks});
  });
  (void)buffer.combine({.x = ok.recv_x, .handle = &ok.handle});
  if (me == 0) fmt::print("ep_buffer: bad input rejected on the calling rank; Buffer usable: OK\n");
  // More tokens than the Buffer holds at once (it was sized for 64 per rank) stream through it.
  run_case(buffer,
           {"more tokens than the Buffer holds at once", ep::Routing::random, 200, 256, 2, 4, false,
            0.1, false, 1},
           o, 100);
}

// The calls moved their rows the way the Buffer's sizing says they must: small Buffers stream
// in many chunks and wait for credits; eager rows appear exactly when enabled.
// `group_eager`: eager streams summed over the ranks (a rank with no tokens sends none).
// `node_peers`: ranks sharing this rank's node, itself excluded.
void check_stats(const BufferStats& s, uint64_t group_eager, const Options& o, int ranks,
                 int node_peers, std::chrono::nanoseconds elapsed) {
  const std::string seen = fmt::format(
      "{} calls, {} eager streams, {} chunks sent, {} received, {} credit stalls, {} combine "
      "chunks reduced in place, {} rows stored in place, {} chunks sent from the caller's x, {} "
      "bytes to node peers, {} to other nodes",
      s.calls, s.eager_streams, s.chunks_sent, s.chunks_received, s.credit_stalls,
      s.chunks_reduced_in_place, s.rows_stored_in_place, s.chunks_sent_from_caller, s.bytes_to_node,
      s.bytes_to_fabric);
  std::fprintf(stderr, "ep_buffer: stats: %s\n", seen.c_str());
  // Every call's time is split into phases: each kind was timed, rows were packed and unpacked
  // (with peers), combines reduced, and the phases add up to no more than the run took.
  const PhaseTimes& d = s.dispatch_phases;
  const PhaseTimes& c = s.combine_phases;
  check(d.calls > 0 && c.calls > 0 && d.calls + c.calls == s.calls,
        "phases timed {} dispatches and {} combines of {} calls", d.calls, c.calls, s.calls);
  check(d.prepare_ns > 0 && d.notify_ns > 0 && d.local_ns > 0 && c.reduce_ns > 0 &&
            c.notify_ns > 0 && d.quiet_ns > 0,
        "a phase was never timed: dispatch prepare {} notify {} local {} quiet {}, combine notify "
        "{} reduce {}",
        d.prepare_ns, d.notify_ns, d.local_ns, d.quiet_ns, c.notify_ns, c.reduce_ns);
  check(d.sum_ns() < static_cast<uint64_t>(elapsed.count()) &&
            c.sum_ns() < static_cast<uint64_t>(elapsed.count()),
        "the phases ({} + {} ns) exceed the run ({} ns)", d.sum_ns(), c.sum_ns(), elapsed.count());
  if (ranks == 1) return;
  check(d.pack_ns > 0 && d.unpack_ns > 0 && c.pack_ns > 0 && c.unpack_ns > 0,
        "rows moved but were not timed: dispatch pack {} unpack {}, combine pack {} unpack {}",
        d.pack_ns, d.unpack_ns, c.pack_ns, c.unpack_ns);
  if (o.small_buffer)
    check(s.chunks_sent >= 2 * s.calls && s.credit_stalls > 0, "a small Buffer must stream: {}",
          seen);
  // Streams between nodes of several chunks that all fit their window: combine reduces them in
  // the slots they landed in.
  // (A Config's smaller window takes that away: --rdma-chunks.)
  if (o.small_chunks && o.rdma_chunks.empty() && o.ranks_per_node > 0 && o.ranks_per_node < ranks)
    check(s.chunks_reduced_in_place > 0, "no combine chunk was reduced in place: {}", seen);
  // Rows from peers land straight in recv_x when the landing region is on and large enough (a
  // small one takes some calls, not others): node peers store them, other nodes write them
  // (tcp registers the region: ep.landing_fabric auto).
  const int64_t landing = params::ep_landing_bytes.get();
  const bool fabric_landing = params::ep_landing_fabric.get() != "off";
  if (s.internode == "hierarchical") {
    // Rows from other nodes come through the forwarders' lanes, never straight into recv_x or
    // from x; with node peers, this rank forwarded some.
    check(s.rows_stored_in_place == 0 && s.chunks_sent_from_caller == 0,
          "hierarchical: rows stored in place or sent from x: {}", seen);
    check(s.rows_to_fabric > 0 && (node_peers == 0 || s.rows_forwarded > 0),
          "hierarchical: {} rows to other nodes, {} forwarded: {}", s.rows_to_fabric,
          s.rows_forwarded, seen);
    return;
  }
  if (landing == 0 || ranks == 1 || (node_peers == 0 && !fabric_landing))
    check(s.rows_stored_in_place == 0, "rows stored in place without a landing region: {}", seen);
  else if (landing >= int64_t{1} << 30)
    check(s.rows_stored_in_place > 0, "no row was stored in place: {}", seen);
  // Every case's combine without weights writes its chunks to other nodes straight from x (tcp
  // and shm read unregistered memory: ep.send_from_x auto), unless the proxy is the node daemon,
  // which cannot read this process's memory (docs/DAEMON.md).
  if (node_peers + 1 == ranks || params::ep_send_from_x.get() == "off" ||
      params::proxy_mode.get() == "daemon")
    check(s.chunks_sent_from_caller == 0, "chunks sent from x without other nodes: {}", seen);
  else
    check(s.chunks_sent_from_caller > 0, "no combine chunk was sent from x: {}", seen);
  if (params::ep_eager_bytes.get() == 0)
    check(group_eager == 0, "eager rows are off but were sent: {} in the group; {}", group_eager,
          seen);
  else
    check(group_eager > 0, "no rank sent eager rows: {}", seen);
}

int run(const Options& o) {
  testing::set_fabric_params(o);
  auto boot = control::Bootstrap::from_environment();
  const int R = boot->world_size();
  BufferOptions options;
  options.ranks_per_node = o.ranks_per_node;
  // The bad-input run sizes its Buffer for 64 tokens of hidden 256.
  const int64_t max_tokens = o.bad_input ? 64 : 128, hidden_bytes = o.bad_input ? 512 : 7168 * 2;
  options.num_nvl_bytes = Buffer::nvl_bytes_hint(max_tokens, hidden_bytes, 8, R);
  int rpn = o.ranks_per_node > 0 ? o.ranks_per_node : boot->env().local_world_size;
  options.num_rdma_bytes =
      std::max<int64_t>(128, Buffer::rdma_bytes_hint(max_tokens, hidden_bytes, 8, R, rpn));
  if (o.small_buffer) {
    // A few of the widest rows per peer: node streams alternate between two slots of ~4 rows,
    // streams between nodes use chunks of ~2 rows with windows of up to 4, so every call waits
    // for credits again and again.
    const int64_t row = Buffer::nvl_bytes_hint(1, hidden_bytes, 8, 1);
    options.num_nvl_bytes = std::max(1, R - 1) * 8 * row;
    options.num_rdma_bytes = R * 4 * row;
    params::ep_chunk_bytes.set(2 * row);
    params::ep_eager_bytes.set(row);  // only the smallest pairs skip the streams
  }
  if (o.small_chunks) params::ep_chunk_bytes.set(2 * Buffer::nvl_bytes_hint(1, hidden_bytes, 8, 1));
  Buffer buffer(*boot, options);
  check_setup_steps(buffer);
  const auto started = std::chrono::steady_clock::now();
  // With --reorder, the calls' writes between nodes must really have been reordered.
  auto require_reordered = [&] {
    if (o.reorder)
      testing::require_reordered(*boot, buffer.stats().reordered_completions, "ep_buffer");
  };
  if (o.bad_input) {
    run_bad_input(buffer, o);
    require_reordered();
    return 0;
  }
  if (o.kill) return run_killed_peer(buffer, *boot, o);
  if (o.die_after_ms > 0) {
    // Every rank repeats the cases until the survivors fail: rank die_rank vanishes in the
    // middle of whatever call (notify or chunk streams) it is in when the timer fires.
    if (boot->rank() == o.die_rank)
      std::thread([ms = o.die_after_ms, rank = o.die_rank] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        std::fprintf(stderr, "ep_buffer: rank %d: vanishing mid-call (test)\n", rank);
        ::_exit(0);  // exit code 0 keeps the launcher from stopping the others
      }).detach();
    try {
      for (int index = 0;; ++index)
        for (const Case& c : cases())
          run_case(buffer, c, o, index);
    } catch (const Error& first) {
      // A survivor: the failed call leaves the ranks out of step, so the Buffer must refuse
      // every later call, naming the failure (the message main prints).
      std::fprintf(stderr, "ep_buffer: first failure: %s\n", first.what());
      run_case(buffer, cases().front(), o, 0);
      fail("ep_buffer", "a call after a failed one was accepted");
    }
  }
  int index = 0;
  for (const Case& c : cases()) {
    if (index == 1 && boot->rank() == o.die_rank) {
      std::fprintf(stderr, "ep_buffer: rank %d: leaving before dispatch (test)\n", o.die_rank);
      ::_exit(0);  // exit code 0 keeps the launcher from stopping the others
    }
    run_case(buffer, c, o, index++);
  }
  if (o.async) run_overlap(buffer, *boot);
  const BufferStats stats = buffer.stats();
  uint64_t group_eager = 0;
  for (const auto& bytes : boot->allgather(
           std::span(reinterpret_cast<const uint8_t*>(&stats.eager_streams), sizeof(uint64_t)),
           "ep_buffer(stats)")) {
    uint64_t theirs = 0;
    std::memcpy(&theirs, bytes.data(), sizeof theirs);
    group_eager += theirs;
  }
  const int rpn_used = buffer.ranks_per_node(), node_first = boot->rank() / rpn_used * rpn_used;
  check_stats(stats, group_eager, o, R, std::min(R, node_first + rpn_used) - node_first - 1,
              std::chrono::steady_clock::now() - started);
  require_reordered();
  if (boot->rank() == 0)
    fmt::print("ep_buffer: {} ranks, {} per node, provider {}, reorder {}: all cases OK\n", R,
               buffer.ranks_per_node(), o.provider, o.reorder ? "on" : "off");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"proxyep::Buffer integration test (run under proxyep launch)"};
  Options o;
  testing::add_ep_test_options(app, o);
  app.add_option("--die-after-ms", o.die_after_ms,
                 "with --die-rank: it vanishes this long after the start instead, mid-call");
  app.add_flag("--kill", o.kill,
               "small calls in a loop; --die-rank dies by SIGKILL after --die-after-ms and every "
               "survivor must fail naming it");
  app.add_option("--death-stamp", o.death_stamp,
                 "with --kill: file where the killed rank writes when it died (CLOCK_MONOTONIC)");
  app.add_option("--fail-within-ms", o.fail_within_ms,
                 "with --kill: each survivor's call must fail within this many ms of the death");
  app.add_flag("--small-buffer", o.small_buffer, "a Buffer of a few rows per peer (streaming)");
  app.add_flag("--small-chunks", o.small_chunks,
               "chunks of ~2 rows between nodes through a Buffer that holds the whole call");
  app.add_flag("--async", o.async, "every call with async_finish, and a combine that overlaps");
  app.add_option("--rdma-chunks", o.rdma_chunks,
                 "S,W: every call's Config has RDMA chunks of S rows (S + 1 on odd nodes), W in "
                 "flight")
      ->expected(2)
      ->delimiter(',');
  return testing::run_ep_test("ep_buffer", app, argc, argv, [&] { return run(o); });
}
