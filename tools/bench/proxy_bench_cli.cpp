// `proxyep bench proxy` on the command line: options, self-launch of 2 ranks when run alone
// (like `bench fabric`), one rank's setup, and the report on rank 0.
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "tools/bench/proxy_bench.hpp"
#include "tools/bench/rank_setup.hpp"
#include "tools/cli_checks.hpp"
#include "tools/self_launch.hpp"
#include "tools/testbed/link_option.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <memory>

namespace proxyep::tools {
namespace {

struct ProxyBenchCli {
  FabricCli fabric;
  ProxyBenchOptions bench;
};

int run_rank(const ProxyBenchCli& cli) {
  auto rank = connect_rank(cli.fabric, "bench.proxy");
  auto results = run_proxy_bench(*rank.bootstrap, *rank.fabric, cli.bench);
  rank.bootstrap->set_progress({});
  return report_results(cli.fabric, rank.bootstrap->rank(), std::move(results), print_proxy_bench);
}

}  // namespace

void register_bench_proxy(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<ProxyBenchCli>();
  auto* cmd = bench.add_subcommand(
      "proxy",
      "descriptor-to-remote-flag latency and descriptors/s through the proxy threads, "
      "against the raw fabric ping-pong of the same size (2 ranks)");
  add_fabric_cli_options(*cmd, cli->fabric, /*with_rails=*/false);
  testbed::add_link_option(*cmd);
  cmd->add_option("--size", cli->bench.size, "bytes per write")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--runs", cli->bench.runs, "repetitions of raw + proxy (medians over them)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--latency-iters", cli->bench.latency_iters, "timed ping-pongs per run")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--stream", cli->bench.stream_writes, "descriptors streamed per run")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--window", cli->bench.window, "writes in flight (raw window, proxy credits)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--idle-seconds", cli->bench.idle_seconds,
                  "window for the idle proxy CPU measurement; 0 skips it")
      ->check(cli_checks::real_at_least(0))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", cli->bench.timeout_ms, "deadline of every wait")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->callback([cli, &action] {
    action = [cli] {
      if (!self_launch::under_launcher()) {
        return start_two_ranks(cli->fabric, "bench.proxy");
      }
      return run_rank(*cli);
    };
  });
}

}  // namespace proxyep::tools
