// `proxyep bench proxy` on the command line: options, self-launch of 2 ranks when run alone
// (like `bench fabric`), one rank's setup, and the report on rank 0.
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "tools/bench/proxy_bench.hpp"
#include "tools/self_launch.hpp"

#include <fmt/format.h>

#include <memory>

namespace proxyep::tools {
namespace {

struct ProxyBenchCli {
  std::string provider;
  bool reorder = false;
  bool json = false;
  ProxyBenchOptions bench;
};

int run_rank(const ProxyBenchCli& cli) {
  if (!cli.provider.empty())
    params::fabric_provider.set(cli.provider, config::Source::command_line);
  if (cli.reorder) params::fabric_reorder.set(true, config::Source::command_line);
  auto bootstrap = control::Bootstrap::from_environment();
  auto fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(bootstrap->rank()));
  bootstrap->set_progress([&fabric] { fabric->progress(); });
  fabric->connect(bootstrap->allgather(fabric->addresses(), "bench.proxy(addresses)"));
  auto results = run_proxy_bench(*bootstrap, *fabric, cli.bench);
  bootstrap->set_progress({});
  if (bootstrap->rank() != 0) return 0;
  results["reorder"] = params::fabric_reorder.get();
  results["requested_provider"] = params::fabric_provider.get();
  if (cli.json)
    fmt::print("{}\n", results.dump(2));
  else
    print_proxy_bench(results);
  return 0;
}

}  // namespace

void register_bench_proxy(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<ProxyBenchCli>();
  auto* cmd = bench.add_subcommand(
      "proxy",
      "descriptor-to-remote-flag latency and descriptors/s through the proxy threads, "
      "against the raw fabric ping-pong of the same size (2 ranks)");
  cmd->add_option("--provider", cli->provider, "libfabric provider (shm, tcp, efa, ...)");
  cmd->add_flag("--reorder", cli->reorder, "run through the reorder shim (EFA SRD semantics)");
  cmd->add_option("--size", cli->bench.size, "bytes per write")->capture_default_str();
  cmd->add_option("--runs", cli->bench.runs, "repetitions of raw + proxy (medians over them)")
      ->capture_default_str();
  cmd->add_option("--latency-iters", cli->bench.latency_iters, "timed ping-pongs per run")
      ->capture_default_str();
  cmd->add_option("--stream", cli->bench.stream_writes, "descriptors streamed per run")
      ->capture_default_str();
  cmd->add_option("--window", cli->bench.window, "writes in flight (raw window, proxy credits)")
      ->capture_default_str();
  cmd->add_option("--idle-seconds", cli->bench.idle_seconds,
                  "window for the idle proxy CPU measurement; 0 skips it")
      ->capture_default_str();
  cmd->add_option("--timeout-ms", cli->bench.timeout_ms, "deadline of every wait")
      ->capture_default_str();
  cmd->add_flag("--json", cli->json, "print one JSON document (rank 0) on stdout");
  cmd->callback([cli, &action] {
    action = [cli] {
      if (!self_launch::under_launcher()) return self_launch::relaunch_as_ranks(2, 2);
      return run_rank(*cli);
    };
  });
}

}  // namespace proxyep::tools
