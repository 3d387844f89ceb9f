// `proxyep bench ep` and `proxyep bench ll` on the command line: options, self-launch of N ranks
// (M per node) when run alone, one rank's run, and on rank 0 the baseline, the report and the
// comparison with a saved run (ep_bench.hpp, ll_bench.hpp, ep_baseline.hpp, ep_compare.hpp). The
// two share all of it but the workload's form, the run and the baseline variants.
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "control/launch_env.hpp"
#include "gpu_side/device/open_device.hpp"
#include "tools/bench/ep_baseline.hpp"
#include "tools/bench/ep_bench.hpp"
#include "tools/bench/ep_compare.hpp"
#include "tools/bench/ep_phases.hpp"
#include "tools/bench/ep_report.hpp"
#include "tools/bench/ll_bench.hpp"
#include "tools/cli_checks.hpp"
#include "tools/self_launch.hpp"
#include "tools/testbed/link_option.hpp"
#include "tools/testbed/testbed_launch.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <memory>

namespace proxyep::tools {
namespace {

// The command line of either command: the bench's options and the saved run to compare with.
struct BenchCli {
  EpBenchOptions options;
  std::string compare;  // --compare FILE; "" = none
};

// The fabric carries only the internode path; across "nodes" of this machine the target
// comparison is tcp;ofi_rxm against Open MPI over TCP, so tcp is the default there.
void apply_fabric_options(const EpBenchOptions& options, const control::LaunchEnv& env) {
  if (!options.provider.empty())
    params::fabric_provider.set(options.provider, config::Source::command_line);
  else if (env.num_nodes() > 1)
    params::fabric_provider.set(std::string("tcp"), config::Source::command_line);
  if (options.reorder) params::fabric_reorder.set(true, config::Source::command_line);
}

const char* command_name(const EpBenchOptions& options) {
  return options.workload.low_latency ? "bench ll" : "bench ep";
}

// `saved`: the run named by --compare (null without it), already checked by load_saved_run.
int run_rank(const EpBenchOptions& options, bool ranks_given, const std::string& compare,
             const nlohmann::json& saved) {
  auto env = control::LaunchEnv::from_environment();
  const bool ll = options.workload.low_latency;
  if (ranks_given &&
      (options.ranks != env.world_size ||
       (options.ranks_per_node > 0 && options.ranks_per_node != env.local_world_size)))
    log::warn(
        "{}: --ranks {} / --ranks-per-node {} ignored: the launcher started {} ranks, {} per node",
        command_name(options), options.ranks, options.ranks_per_node, env.world_size,
        env.local_world_size);
  // Started by another launcher: each rank checks what the self-launch checks before spawning,
  // before it joins the others (the ranks on this node count against this machine's memory).
  check_ep_bench(options, env.world_size, env.local_world_size, env.local_world_size);
  apply_fabric_options(options, env);
  nlohmann::json results;
  {
    // The bootstrap (and the Buffer inside run_ep_bench) are gone before the baseline starts:
    // our ranks must not compete with MPI's for the cores.
    auto bootstrap = control::Bootstrap::from_environment();
    results = ll ? run_ll_bench(*bootstrap, options) : run_ep_bench(*bootstrap, options);
  }
  if (env.rank != 0) return 0;
  results["provider"] = params::fabric_provider.get();
  results["reorder"] = params::fabric_reorder.get();
  nlohmann::json baseline, upper_bracket;
  bool baseline_failed = false;
  if (options.baseline != "none") {
    try {
      MpiBaselineRequest request;
      request.workload = options.workload;
      request.variant = options.baseline;
      request.ranks = env.world_size;
      request.ranks_per_node = env.local_world_size;
      request.timeout = std::chrono::seconds(options.baseline_timeout_s);
      request.extra_mpirun_args = options.mpirun_args;
      // On the testbed the baseline runs in the same namespaces, over the same links.
      request.testbed_namespaces = testbed::node_namespaces();
      baseline = run_mpi_baseline(request);
      // Off it, tcp everywhere alone would flatter us: shared memory everywhere bounds MPI
      // from the other side.
      if (baseline_needs_brackets(request)) {
        request.shared_memory_everywhere = true;
        upper_bracket = run_mpi_baseline(request);
      }
    } catch (const Error& e) {
      // Our figures are still worth printing; the run fails all the same.
      results["baseline_error"] = e.what();
      baseline_failed = true;
    }
  }
  attach_baseline(results, std::move(baseline), std::move(upper_bracket));
  if (!saved.is_null()) results["compare"] = compare_runs(results, saved, compare);
  if (options.json) {
    fmt::print("{}\n", results.dump(2));
  } else {
    if (ll)
      print_ll_report(results);
    else
      print_ep_report(results);
    if (!saved.is_null()) print_comparison(results["compare"]);
    if (options.breakdown && results.contains("proxyep") && results["proxyep"].contains("phases"))
      fmt::print("where the time went (phases of the Buffer's calls):\n{}",
                 format_phases(results["proxyep"]["phases"]));
  }
  if (baseline_failed)
    fmt::print(stderr, "proxyep {}: baseline failed: {}\n", command_name(options),
               results["baseline_error"].get<std::string>());
  return results["verified"].get<bool>() && !baseline_failed ? 0 : 1;
}

// The options both commands take besides the workload's, and the action.
void add_run_options(CLI::App& cmd, BenchCli& cli) {
  EpBenchOptions& options = cli.options;
  cmd.add_option("--ranks", options.ranks, "ranks to start when run alone")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--ranks-per-node", options.ranks_per_node,
                 "ranks per emulated node (default: all on one node)")
      ->check(cli_checks::at_least(1));
  add_ep_workload_options(cmd, options.workload);
  cmd.add_option("--provider", options.provider,
                 "fabric provider of the internode path (default tcp when the ranks span nodes)");
  cmd.add_flag("--reorder", options.reorder,
               "internode writes through the reorder shim (EFA SRD semantics)");
  testbed::add_link_option(cmd);
  if (options.workload.low_latency)
    cmd.add_option("--baseline", options.baseline,
                   "also run the same workload with MPI_Alltoallv (Open MPI, through mpirun)")
        ->check(CLI::IsMember({"none", kMpiLean}))
        ->capture_default_str();
  else
    cmd.add_option("--baseline", options.baseline,
                   "also run the same workload with MPI (Open MPI, through mpirun): mpi = the lean "
                   "program (Alltoallv of the rows straight into the receive tensor), "
                   "mpi-records = one record per row with its metadata, unpacked after")
        ->check(CLI::IsMember({"none", kMpiLean, kMpiRecords}))
        ->capture_default_str();
  cmd.add_option("--baseline-timeout", options.baseline_timeout_s,
                 "seconds the MPI baseline may take")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--mpirun-arg", options.mpirun_args,
                 "extra mpirun argument (repeatable; --mpirun-arg=--mca ...)");
  const char* normal = options.workload.low_latency ? "the normal-mode Buffer's " : "the Buffer's ";
  cmd.add_option("--nvl-bytes", options.nvl_bytes,
                 std::string(normal) +
                     "num_nvl_bytes (default: room for a whole call; smaller Buffers stream each "
                     "call in chunks, as DeepEP's Config-sized buffers do)")
      ->check(cli_checks::at_least(0));
  cmd.add_option("--rdma-bytes", options.rdma_bytes,
                 std::string(normal) + "num_rdma_bytes (default: room for a whole call)")
      ->check(cli_checks::at_least(0));
  if (!options.workload.low_latency) {
    cmd.add_option("--internode", options.internode,
                   "across nodes: hierarchical or per_rank (ep.internode), or both: per_rank "
                   "then hierarchical in the same run, reported side by side")
        ->check(CLI::IsMember({"hierarchical", "per_rank", "both"}));
    cmd.add_option("--device", options.device,
                   "where the tensors live: host (the CPU backend), simulated (the host-simulated "
                   "device: the device path end to end, checked; not GPU timings) or cuda (each "
                   "rank's GPU, local rank modulo the GPUs visible)")
        ->check(CLI::IsMember(gpu_side::device::device_kinds()));
  }
  cmd.add_flag("--json", options.json, "print one JSON document (rank 0) on stdout");
  cmd.add_flag("--breakdown", options.breakdown,
               "also print each phase's time per call (prepare, notify, pack, post, local, "
               "unpack, wait, reduce, quiet; the JSON always has them under proxyep.phases)");
  cmd.add_option("--compare", cli.compare,
                 "a saved --json run of the same shape: print each timed path's p50 and p99 as "
                 "now / saved (and put them under \"compare\" in the JSON)");
}

void set_action(CLI::App* cmd, const std::shared_ptr<BenchCli>& cli, Action& action) {
  cmd->callback([cli, cmd, &action] {
    bool ranks_given = cmd->count("--ranks") + cmd->count("--ranks-per-node") > 0;
    action = [cli, ranks_given] {
      const EpBenchOptions& options = cli->options;
      // After the options' checks (bad input is named first), before the run. Returns the saved
      // run of --compare (null without it).
      auto check_runnable = [&](int ranks) {
        if (options.workload.low_latency)
          require(low_latency_available(), "bench.ll",
                  "this build has no low-latency implementation (Buffer::low_latency_dispatch / "
                  "low_latency_combine): rebuild once it has landed");
        // Fail before the run, not after it, when the baseline cannot run or the saved run
        // cannot be compared with this one.
        if (options.baseline != "none") check_mpi_baseline_available();
        // A build or machine without CUDA is named before any rank starts.
        if (options.device == "cuda")
          (void)gpu_side::device::open_device(options.device, 0, "bench.ep");
        return cli->compare.empty() ? nlohmann::json()
                                    : load_saved_run(cli->compare, options.workload, ranks);
      };
      if (!self_launch::under_launcher()) {
        int per_node = testbed::effective_ranks_per_node(options.ranks, options.ranks_per_node,
                                                         params::launch_link.get());
        testbed::check_provider_crosses_links(options.provider, command_name(options));
        // The whole run is checked before any rank starts (all of them run on this machine).
        check_ep_bench(options, options.ranks, per_node, options.ranks);
        check_runnable(options.ranks);
        return self_launch::relaunch_as_ranks(options.ranks, per_node);
      }
      auto saved = check_runnable(control::LaunchEnv::from_environment().world_size);
      return run_rank(options, ranks_given, cli->compare, saved);
    };
  });
}

}  // namespace

void register_bench_ep(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<BenchCli>();
  auto* cmd = bench.add_subcommand(
      "ep",
      "EP dispatch/combine through the DeepEP-compatible Buffer (DeepEP's test parameters and "
      "byte conventions), checked against a reference, optionally against MPI (lean or record "
      "variant)");
  add_run_options(*cmd, *cli);
  EpBenchOptions& options = cli->options;
  cmd->add_flag_callback(
      "--no-floor", [&options] { options.floor = false; },
      "skip the memory floor (on by default: after the timed loop every rank times a plain "
      "memcpy of its received rows, all ranks at once; the \"memcpy floor\" row and how far "
      "dispatch+combine is above 2 such copies)");
  set_action(cmd, cli, action);
}

void register_bench_ll(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<BenchCli>();
  cli->options.workload = low_latency_workload_defaults();
  cli->options.floor = false;  // bench ll compares with normal mode, not with the memory floor
  auto* cmd = bench.add_subcommand(
      "ll",
      "low-latency dispatch/combine through the Buffer (DeepEP's test_low_latency.py data and "
      "byte conventions), beside normal mode on the same tokens, checked, optionally against "
      "MPI_Alltoallv");
  add_run_options(*cmd, *cli);
  cmd->add_flag("--hook", cli->options.hook,
                "return_recv_hook: time the send phase (the call) and the receive phase (hook()) "
                "apart");
  set_action(cmd, cli, action);
}

}  // namespace proxyep::tools
