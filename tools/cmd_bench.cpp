// `proxyep bench <what>`: benchmarks. Each runs as ranks: under `proxyep launch` or torchrun
// (RANK in the environment) it joins them; otherwise it starts the ranks it needs itself, so
// `proxyep bench fabric --provider tcp` works on its own.
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "tools/bench/ep_bench.hpp"
#include "tools/bench/fabric_bench.hpp"
#include "tools/bench/proxy_bench.hpp"
#include "tools/bench/rank_setup.hpp"
#include "tools/bench/rendezvous_bench.hpp"
#include "tools/bench/ring_bench.hpp"
#include "tools/cli_checks.hpp"
#include "tools/commands.hpp"
#include "tools/self_launch.hpp"
#include "tools/testbed/link_option.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

namespace proxyep::tools {
namespace {

struct FabricBenchCli {
  FabricCli fabric;
  FabricBenchOptions bench;
};

int run_fabric_bench_rank(const FabricBenchCli& cli) {
  auto rank = connect_rank(cli.fabric, "bench.fabric");
  auto results = run_fabric_bench(*rank.bootstrap, *rank.fabric, cli.bench);
  return report_results(cli.fabric, rank.bootstrap->rank(), std::move(results), print_fabric_bench);
}

void register_bench_fabric(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<FabricBenchCli>();
  auto* cmd = bench.add_subcommand(
      "fabric",
      "RMA write-with-immediate bandwidth and latency between 2 ranks (size sweep); with --link "
      "between two emulated nodes, reporting the link rate it measured (link_gbps)");
  add_fabric_cli_options(*cmd, cli->fabric, /*with_rails=*/true);
  testbed::add_link_option(*cmd);
  cmd->add_option("--sizes", cli->bench.sizes, "write sizes in bytes (default 4 KiB..1 MiB)")
      ->check(cli_checks::at_least(1));
  cmd->add_option("--window", cli->bench.window, "writes in flight")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--reps", cli->bench.reps, "timed bandwidth repetitions per size")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--bytes-per-rep", cli->bench.bytes_per_rep, "bytes streamed per repetition")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--latency-iters", cli->bench.latency_iters, "timed ping-pongs per size")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", cli->bench.timeout_ms, "deadline of every wait")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->callback([cli, &action] {
    action = [cli] {
      if (!self_launch::under_launcher()) {
        return start_two_ranks(cli->fabric, "bench.fabric");
      }
      return run_fabric_bench_rank(*cli);
    };
  });
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "benchmarks (each reports medians and p99)");
  bench->require_subcommand(1);
  register_bench_ep(*bench, action);
  register_bench_fabric(*bench, action);
  register_bench_ll(*bench, action);
  register_bench_proxy(*bench, action);
  register_bench_rendezvous(*bench, action);
  register_bench_ring(*bench, action);
  register_bench_rl(*bench, action);
}

}  // namespace proxyep::tools
