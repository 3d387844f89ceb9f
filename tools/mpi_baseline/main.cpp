// proxyep-mpi-baseline: the MPI side of `proxyep bench ep --baseline mpi|mpi-records` and, as
// `proxyep-mpi-baseline ll`, of `proxyep bench ll --baseline mpi` (tools/bench/ep_baseline.hpp
// starts it through mpirun with the same workload flags). Runs the same inputs as the bench
// (gpu_side/ep/workload.hpp; tools/bench/ll_check.hpp) through one of the MPI implementations --
// normal mode: the lean one (mpi_ep_lean.hpp, variant "mpi") or, with --records, the record one
// (mpi_ep.hpp, "mpi-records"); low-latency: mpi_ll.hpp -- times it with the bench's protocol
// (barrier, then each phase; the slowest rank per iteration), checks the outputs against the
// reference, and prints one JSON object on rank 0's stdout, naming the variant that ran.
#include "common/error.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/workload.hpp"
#include "tools/bench/ep_check.hpp"
#include "tools/bench/ep_options.hpp"
#include "tools/bench/ep_stats.hpp"
#include "tools/bench/ll_check.hpp"
#include "tools/mpi_baseline/mpi_ep.hpp"
#include "tools/mpi_baseline/mpi_ep_lean.hpp"
#include "tools/mpi_baseline/mpi_ll.hpp"

#include <fmt/format.h>
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct BaselineCli {
  EpWorkloadCli workload;
  int ranks_per_node = 0;  // 0 = all ranks on one node (only the RDMA byte figures use it)
  bool records = false;    // normal mode: the record variant (mpi_ep.hpp) instead of the lean one
};

struct RankRun {
  EpRankTimings timings;
  MpiDispatched last_dispatch;
  ep::Tensor last_combined;
};

// Warm-up and timed iterations. A first, untimed dispatch provides the combine input (the
// "expert output", ep_check.hpp): the routing is the same every iteration, so it stays valid.
template <class MpiEp>  // MpiLeanEp or MpiAlltoallvEp
RankRun run_iterations(MpiEp& ep_impl, const MpiDispatchInputs& in, const EpWorkloadCli& cli) {
  RankRun run;
  MpiDispatched first = ep_impl.dispatch(in);
  ep::Tensor expert_out = expert_output(first.recv_x, first.recv_x_scales);
  for (int i = 0; i < cli.warmup + cli.iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    MpiDispatched d = ep_impl.dispatch(in);
    auto t1 = Clock::now();
    ep::Tensor combined = ep_impl.combine(expert_out);
    auto t2 = Clock::now();
    // Kept until the next iteration's calls are done, in the warm-up too, as `bench ep` keeps
    // ProxyEP's: the timed loop starts with memory in its steady state.
    run.last_dispatch = std::move(d);
    run.last_combined = std::move(combined);
    if (i < cli.warmup) continue;
    run.timings.dispatch.push_back(seconds_between(t0, t1));
    run.timings.combine.push_back(seconds_between(t1, t2));
    run.timings.total.push_back(seconds_between(t0, t2));
  }
  return run;
}

// Every rank's samples of one phase on rank 0 (empty elsewhere).
std::vector<std::vector<double>> gather_samples(const std::vector<double>& mine, int ranks) {
  std::vector<double> all(mine.size() * static_cast<size_t>(ranks));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
             static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  std::vector<std::vector<double>> per_rank;
  for (int r = 0; r < ranks; ++r)
    per_rank.emplace_back(all.begin() + r * static_cast<ptrdiff_t>(mine.size()),
                          all.begin() + (r + 1) * static_cast<ptrdiff_t>(mine.size()));
  return per_rank;
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  return version.substr(0, version.find_first_of(",\n"));
}

// What the report divides by, per rank (DeepEP's conventions; the remote figures only when the
// ranks span nodes).
struct PhaseVolumes {
  std::vector<double> dispatch_bytes, combine_bytes, remote_dispatch_bytes, remote_combine_bytes;
  std::vector<double> remote_messages;  // low-latency: messages to ranks on other nodes
};

// The verdict over ranks (`diff` is this rank's check), the slowest rank's timings, and rank 0's
// JSON line. Collective.
int finish(const BaselineCli& cli, const ep::EpShape& shape, const EpRankTimings& timings,
           const std::string& diff, const char* variant, const char* implementation,
           const PhaseVolumes& volumes) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int ranks = shape.num_ranks;
  if (!diff.empty())
    std::fprintf(stderr, "proxyep-mpi-baseline: rank %d: %s\n", rank, diff.c_str());
  int ok = diff.empty() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  auto dispatch = slowest_rank(gather_samples(timings.dispatch, ranks));
  auto combine = slowest_rank(gather_samples(timings.combine, ranks));
  auto total = slowest_rank(gather_samples(timings.total, ranks));
  if (rank != 0) return 0;
  const bool multi_node = shape.num_nodes() > 1;
  auto remote = [&](const std::vector<double>& values) {
    return multi_node ? values : std::vector<double>{};
  };
  nlohmann::json out = {
      {"variant", variant},  // what `bench ep|ll --baseline` names it
      {"implementation", implementation},
      {"mpi_library", mpi_library_version()},
      {"ranks", ranks},
      {"ranks_per_node", shape.ranks_per_node},
      {"workload", to_json(cli.workload)},
      {"dispatch",
       phase_json(dispatch, volumes.dispatch_bytes, remote(volumes.remote_dispatch_bytes),
                  remote(volumes.remote_messages))},
      {"combine", phase_json(combine, volumes.combine_bytes, remote(volumes.remote_combine_bytes),
                             remote(volumes.remote_messages))},
      {"total", phase_json(total, {})},
      {"verified", all_ok != 0}};
  if (!diff.empty()) out["mismatch"] = fmt::format("rank 0: {}", diff);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The normal-mode run of one implementation (MpiLeanEp or MpiAlltoallvEp).
template <class MpiEp>
int run_normal(const BaselineCli& cli, const char* variant, const char* implementation) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  ep::EpShape shape{ranks, cli.ranks_per_node > 0 ? cli.ranks_per_node : ranks,
                    cli.workload.experts};
  validate(cli.workload, shape);
  auto options = to_workload(cli.workload, shape);
  auto inputs = ep::make_rank_inputs(options, rank);
  auto layout = ep::compute_dispatch_layout(inputs.topk_idx, shape);
  MpiDispatchInputs in{cli.workload.fp8 ? inputs.x_fp8.ref() : inputs.x.ref(),
                       cli.workload.fp8 ? inputs.x_scales.ref() : ep::TensorRef{},
                       inputs.topk_idx.ref(), inputs.topk_weights.ref(),
                       layout.is_token_in_rank.ref()};
  MpiEp ep_impl(MPI_COMM_WORLD, shape, cli.workload.hidden, cli.workload.topk, cli.workload.fp8);
  RankRun result = run_iterations(ep_impl, in, cli.workload);

  // Check this rank's outputs against the reference; `verified` is the AND over ranks.
  EpReference reference(options, rank);
  const auto& d = result.last_dispatch;
  std::string diff =
      compare_dispatch({d.recv_x, d.recv_x_scales, d.recv_topk_idx, d.recv_topk_weights,
                        d.recv_src_idx, &d.num_recv_tokens_per_expert},
                       reference.dispatch());
  if (diff.empty())
    diff = compare_tensor(result.last_combined, reference.combine().combined_x, "combined_x");
  const auto& traffic = reference.traffic();
  return finish(cli, shape, result.timings, diff, variant, implementation,
                {traffic.dispatch_bytes,
                 traffic.combine_bytes,
                 traffic.rdma_dispatch_bytes,
                 traffic.rdma_combine_bytes,
                 {}});
}

int run(const BaselineCli& cli) {
  if (cli.records)
    return run_normal<MpiAlltoallvEp>(
        cli, "mpi-records",
        "pack records (row + metadata) + MPI_Alltoall(counts) + MPI_Alltoallv + unpack; "
        "MPI_Alltoallv back + float32 reduce for combine");
  return run_normal<MpiLeanEp>(
      cli, "mpi",
      "MPI_Alltoall(counts) + pack rows once + MPI_Alltoallv of rows into recv_x (+ scales, + "
      "metadata records); MPI_Alltoallv back + float32 reduce for combine");
}

// Low-latency semantics (mpi_ll.hpp) on DeepEP's test data, timed as `bench ll` times its loop:
// the expert output from a first, untimed dispatch; then per iteration: barrier, dispatch,
// combine (as bench ll and bench ep time theirs).
int run_ll(const BaselineCli& cli) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto& w = cli.workload;
  ep::EpShape shape{ranks, cli.ranks_per_node > 0 ? cli.ranks_per_node : ranks, w.experts};
  validate(w, shape);
  LlReference reference(to_workload(w, shape));
  const auto& in = reference.inputs().at(rank);
  MpiAlltoallvLl ll(MPI_COMM_WORLD, shape, w.tokens, w.hidden, w.topk, w.fp8);
  EpRankTimings timings;
  ep::Tensor expert_out;
  std::string diff;
  {  // the expert output from a first, untimed dispatch (as bench ll does)
    MpiLlDispatched first = ll.dispatch(in.x, in.topk_idx);
    ll_expert_output(
        {first.recv_x, first.recv_x_scales, first.recv_count, first.src_info, first.layout_range},
        shape.experts_per_rank(), expert_out);
  }
  for (int i = 0; i < w.warmup + w.iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    MpiLlDispatched d = ll.dispatch(in.x, in.topk_idx);
    auto t1 = Clock::now();
    ep::Tensor combined = ll.combine(expert_out, in.topk_weights);
    auto t2 = Clock::now();
    if (i + 1 == w.warmup + w.iters) {
      LlDispatchOutputs views{d.recv_x, d.recv_x_scales, d.recv_count, d.src_info, d.layout_range};
      diff = reference.check_dispatch(rank, views);
      if (diff.empty()) diff = reference.check_combine(rank, combined);
    }
    if (i < w.warmup) continue;
    timings.dispatch.push_back(seconds_between(t0, t1));
    timings.combine.push_back(seconds_between(t1, t2));
    timings.total.push_back(seconds_between(t0, t2));
  }
  const auto& traffic = reference.traffic();
  return finish(cli, shape, timings, diff, "mpi",
                "FP8 cast + per-expert pack + MPI_Alltoall(counts) + MPI_Alltoallv + unpack to "
                "[E_local, R*T, H]; MPI_Alltoallv back + weighted float32 reduce for combine",
                {traffic.dispatch_bytes, traffic.combine_bytes, traffic.remote_dispatch_bytes,
                 traffic.remote_combine_bytes, traffic.remote_selections});
}

}  // namespace
}  // namespace proxyep::tools

int main(int argc, char** argv) {
  using namespace proxyep::tools;
  BaselineCli cli, ll_cli;
  ll_cli.workload = low_latency_workload_defaults();
  CLI::App app{"proxyep-mpi-baseline: EP dispatch/combine with MPI_Alltoallv (run under mpirun)"};
  add_ep_workload_options(app, cli.workload);
  const char* ranks_per_node_help =
      "ranks per node, for the RDMA byte figures (0 = all on one node)";
  app.add_option("--ranks-per-node", cli.ranks_per_node, ranks_per_node_help);
  app.add_flag("--records", cli.records,
               "the record variant (`bench ep --baseline mpi-records`: one record per row with its "
               "metadata, unpacked after the exchange) instead of the lean one");
  auto* ll = app.add_subcommand("ll", "DeepEP's low-latency semantics (bench ll's baseline)");
  add_ep_workload_options(*ll, ll_cli.workload);
  ll->add_option("--ranks-per-node", ll_cli.ranks_per_node, ranks_per_node_help);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = ll->parsed() ? run_ll(ll_cli) : run(cli);
  } catch (const std::exception& e) {
    // The other ranks may be inside a collective: only MPI_Abort ends the job in bounded time.
    std::fprintf(stderr, "proxyep-mpi-baseline: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return code;
}
