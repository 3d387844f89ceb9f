#include "tools/bench/ll_bench.hpp"
#include "tools/bench/fabric_bytes.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "integrations/buffer.hpp"
#include "tools/bench/ll_check.hpp"
#include "tools/bench/setup_report.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;

// The phases one rank times, per timed iteration (seconds); the *_send / *_recv ones with --hook.
constexpr const char* kPhases[] = {"dispatch",      "combine",      "total",       "dispatch_send",
                                   "dispatch_recv", "combine_send", "combine_recv"};

struct LlRankRun {
  std::map<std::string, std::vector<double>> timings;
  std::optional<uint64_t> reordered;
  int64_t num_rdma_bytes = 0;
  std::string diff;              // the check's verdict ("" = passed)
  double combine_diff = 0;       // calc_diff of the last combine
  CallFabricBytes fabric_bytes;  // one call's bytes to other nodes (fabric_bytes.hpp)
  StepClock::Steps setup;        // BufferStats::setup_steps: the Buffer's creation
};

#if PROXYEP_HAVE_LOW_LATENCY

LlDispatchOutputs views(const LowLatencyDispatchResult& d) {
  return {d.recv_x, d.recv_x_scales, d.recv_count, d.handle.src_info, d.handle.layout_range};
}

// One timed phase (dispatch or combine): a barrier (when named), start, the call, sent, its hook
// (with --hook; without, the call received already), received.
struct PhaseTimes {
  Clock::time_point start, sent, received;
};

template <class Call>
auto timed_phase(control::Bootstrap* bootstrap, const char* barrier, bool hook, PhaseTimes& t,
                 Call call) {
  if (bootstrap != nullptr) bootstrap->barrier(barrier);
  t.start = Clock::now();
  auto result = call();
  t.sent = Clock::now();
  if (hook) result.hook();
  t.received = Clock::now();
  return result;
}

void record(LlRankRun& run, const std::string& phase, const PhaseTimes& t, bool hook) {
  run.timings[phase].push_back(seconds_between(t.start, t.received));
  if (!hook) return;
  run.timings[phase + "_send"].push_back(seconds_between(t.start, t.sent));
  run.timings[phase + "_recv"].push_back(seconds_between(t.sent, t.received));
}

// The timed loop of the low-latency phase and the check of its last iteration's outputs.
LlRankRun run_low_latency(control::Bootstrap& bootstrap, const EpBenchOptions& options,
                          const ep::EpShape& shape, const ep::RankInputs& in,
                          const LlReference& reference) {
  const auto& cli = options.workload;
  const bool hook = options.hook;
  BufferOptions sizes;
  sizes.low_latency_mode = true;
  sizes.num_rdma_bytes =
      Buffer::get_low_latency_rdma_size_hint(cli.tokens, cli.hidden, shape.num_ranks, cli.experts);
  sizes.num_qps_per_rank = shape.experts_per_rank();  // as DeepEP's test does
  sizes.ranks_per_node = shape.ranks_per_node;
  Buffer buffer(bootstrap, sizes);
  LowLatencyDispatchArgs dispatch_args;
  dispatch_args.x = in.x;
  dispatch_args.topk_idx = in.topk_idx;
  dispatch_args.num_max_dispatch_tokens_per_rank = cli.tokens;
  dispatch_args.num_experts = cli.experts;
  dispatch_args.use_fp8 = cli.fp8;
  dispatch_args.return_recv_hook = hook;
  LowLatencyCombineArgs combine_args;
  combine_args.topk_idx = in.topk_idx;
  combine_args.topk_weights = in.topk_weights;
  combine_args.return_recv_hook = hook;
  ep::Tensor expert_out;  // bf16 [E_local * R*T, H], reused

  LlRankRun run;
  run.num_rdma_bytes = sizes.num_rdma_bytes;
  // The expert output comes from a first, untimed dispatch: the routing is the same every
  // iteration and the receive layout is deterministic, so its rows stay valid. Each iteration is
  // then timed as `bench ep` times normal mode (and DeepEP's test a dispatch + combine pair):
  // one barrier, then dispatch and combine back to back.
  // It and an untimed combine also give one call's fabric bytes (the same every iteration).
  {
    const uint64_t start_bytes = buffer.stats().bytes_to_fabric;
    LowLatencyDispatchResult first = buffer.low_latency_dispatch(dispatch_args);
    if (hook) first.hook();
    const uint64_t dispatched_bytes = buffer.stats().bytes_to_fabric;
    ll_expert_output(views(first), shape.experts_per_rank(), expert_out);
    combine_args.x = expert_out;
    combine_args.handle = &first.handle;
    LowLatencyCombineResult combined = buffer.low_latency_combine(combine_args);
    if (hook) combined.hook();
    run.fabric_bytes = {dispatched_bytes - start_bytes,
                        buffer.stats().bytes_to_fabric - dispatched_bytes};
  }
  combine_args.x = expert_out;
  for (int i = 0; i < cli.warmup + cli.iters; ++i) {
    PhaseTimes dispatch_times, combine_times;
    LowLatencyDispatchResult d =
        timed_phase(&bootstrap, "bench.ll(iteration)", hook, dispatch_times,
                    [&] { return buffer.low_latency_dispatch(dispatch_args); });
    combine_args.handle = &d.handle;
    LowLatencyCombineResult c = timed_phase(nullptr, nullptr, hook, combine_times, [&] {
      return buffer.low_latency_combine(combine_args);
    });
    if (i + 1 == cli.warmup + cli.iters) {
      run.diff = reference.check_dispatch(bootstrap.rank(), views(d));
      if (!run.diff.empty())
        run.diff = "low-latency dispatch: " + run.diff;
      else if (auto diff =
                   reference.check_combine(bootstrap.rank(), c.combined_x, &run.combine_diff);
               !diff.empty())
        run.diff = "low-latency combine: " + diff;
    }
    if (i < cli.warmup) continue;
    record(run, "dispatch", dispatch_times, hook);
    record(run, "combine", combine_times, hook);
    run.timings["total"].push_back(seconds_between(dispatch_times.start, combine_times.received));
  }
  const BufferStats stats = buffer.stats();
  run.reordered = stats.reordered_completions;
  run.setup = stats.setup_steps;
  // Every rank's last call done before any Buffer goes: a rank whose last combine has received
  // all it waits for may still have sends of its own in flight (held by the reorder shim, say)
  // that a peer's combine waits for; destroying its Buffer then would strand that peer.
  bootstrap.barrier("bench.ll(done)");
  return run;
}

#else

LlRankRun run_low_latency(control::Bootstrap&, const EpBenchOptions&, const ep::EpShape&,
                          const ep::RankInputs&, const LlReference&) {
  fail("bench.ll",
       "this build has no low-latency implementation (Buffer::low_latency_dispatch / "
       "low_latency_combine): rebuild after it has landed");
}

#endif

nlohmann::json rank_report(const LlRankRun& run) {
  nlohmann::json report = {{"diff", run.diff}, {"combine_calc_diff", run.combine_diff}};
  for (const auto& [phase, samples] : run.timings)
    report[phase] = samples;
  if (run.reordered) report["reordered_completions"] = *run.reordered;
  report["fabric_bytes"] = to_json(run.fabric_bytes);
  report["setup"] = setup_steps_json(run.setup);
  return report;
}

// Rank 0: every rank's report -> the figures of the low-latency phase.
nlohmann::json summarize(const RankReports& reports, const LlTraffic& traffic,
                         const ep::EpShape& shape) {
  const bool multi_node = shape.num_nodes() > 1;
  auto remote = [&](const std::vector<double>& values) {
    return multi_node ? values : std::vector<double>{};
  };
  nlohmann::json out = {
      {"dispatch",
       phase_json(slowest_rank(reports, "dispatch"), traffic.dispatch_bytes,
                  remote(traffic.remote_dispatch_bytes), remote(traffic.remote_selections))},
      {"combine",
       phase_json(slowest_rank(reports, "combine"), traffic.combine_bytes,
                  remote(traffic.remote_combine_bytes), remote(traffic.remote_selections))},
      {"total", phase_json(slowest_rank(reports, "total"), {})}};
  for (const char* phase : kPhases)
    if (!out.contains(phase) && reports.front().contains(phase))
      out[phase] = phase_json(slowest_rank(reports, phase), {});
  if (multi_node)
    out["fabric"] = fabric_bytes_json(
        reports, shape.ranks_per_node, "DeepEP LL: one message per (token, expert on another node)",
        traffic.remote_dispatch_bytes, traffic.remote_combine_bytes,
        out["dispatch"]["us"]["p50"].get<double>(), out["combine"]["us"]["p50"].get<double>());
  double worst_calc_diff = 0;
  for (const auto& r : reports)
    worst_calc_diff = std::max(worst_calc_diff, r.at("combine_calc_diff").get<double>());
  out["combine_calc_diff_max"] = worst_calc_diff;
  out["setup"] = setup_summary(reports);
  add_verdict(out, reports);
  return out;
}

}  // namespace

bool low_latency_available() {
  return PROXYEP_HAVE_LOW_LATENCY != 0;
}

nlohmann::json run_ll_bench(control::Bootstrap& bootstrap, const EpBenchOptions& options) {
  const auto& env = bootstrap.env();
  ep::EpShape shape{env.world_size, env.local_world_size, options.workload.experts};
  validate(options.workload, shape);
  const auto workload = to_workload(options.workload, shape);
  const int rank = bootstrap.rank();
  // Every rank's inputs (small at LL sizes): this rank's and the reference's.
  LlReference reference(workload);
  const ep::RankInputs& inputs = reference.inputs().at(rank);

  LlRankRun run = run_low_latency(bootstrap, options, shape, inputs, reference);
  log::info("bench ll: low-latency loop done and checked");
  if (!run.diff.empty()) log::error("bench ll: output differs from the reference: {}", run.diff);
  auto reports = gather_reports(bootstrap, rank_report(run), "bench.ll(results)");

  // The same tokens through normal mode, in a Buffer of its own.
  auto normal = run_normal_mode(bootstrap, options, shape, inputs,
                                [&] { return EpReference(workload, rank, reference.inputs()); });
  if (rank != 0) return {};
  nlohmann::json out = {{"benchmark", "ll"},
                        {"ranks", shape.num_ranks},
                        {"ranks_per_node", shape.ranks_per_node},
                        {"nodes", shape.num_nodes()},
                        {"hook", options.hook},
                        {"num_rdma_bytes", run.num_rdma_bytes},
                        {"workload", to_json(options.workload)},
                        {"traffic", reference.traffic().to_json(shape.num_nodes())},
                        {"proxyep", summarize(reports, reference.traffic(), shape)}};
  normal["proxyep"]["num_nvl_bytes"] = normal["num_nvl_bytes"];
  normal["proxyep"]["num_rdma_bytes"] = normal["num_rdma_bytes"];
  out["normal"] = normal["proxyep"];
  return out;
}

}  // namespace proxyep::tools
