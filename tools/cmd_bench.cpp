// `proxyep bench <what>`: benchmarks. Each runs as ranks: under `proxyep launch` or torchrun
// (RANK in the environment) it joins them; otherwise it starts the ranks it needs itself, so
// `proxyep bench fabric --provider tcp` works on its own.
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "tools/bench/fabric_bench.hpp"
#include "tools/bench/proxy_bench.hpp"
#include "tools/bench/ring_bench.hpp"
#include "tools/commands.hpp"
#include "tools/self_launch.hpp"

#include <fmt/format.h>

namespace proxyep::tools {
namespace {

struct FabricBenchCli {
  std::string provider;
  int rails = 0;
  bool reorder = false;
  bool json = false;
  FabricBenchOptions bench;
};

int run_fabric_bench_rank(const FabricBenchCli& cli) {
  if (!cli.provider.empty())
    params::fabric_provider.set(cli.provider, config::Source::command_line);
  if (cli.rails > 0) params::fabric_rails.set(cli.rails, config::Source::command_line);
  if (cli.reorder) params::fabric_reorder.set(true, config::Source::command_line);
  auto bootstrap = control::Bootstrap::from_environment();
  auto fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(bootstrap->rank()));
  bootstrap->set_progress([&fabric] { fabric->progress(); });
  fabric->connect(bootstrap->allgather(fabric->addresses(), "bench.fabric(addresses)"));
  auto results = run_fabric_bench(*bootstrap, *fabric, cli.bench);
  if (bootstrap->rank() != 0) return 0;
  results["reorder"] = params::fabric_reorder.get();
  results["requested_provider"] = params::fabric_provider.get();
  if (cli.json)
    fmt::print("{}\n", results.dump(2));
  else
    print_fabric_bench(results);
  return 0;
}

void register_bench_fabric(CLI::App& bench, Action& action) {
  auto cli = std::make_shared<FabricBenchCli>();
  auto* cmd = bench.add_subcommand(
      "fabric", "RMA write-with-immediate bandwidth and latency between 2 ranks (size sweep)");
  cmd->add_option("--provider", cli->provider, "libfabric provider (shm, tcp, efa, ...)");
  cmd->add_option("--rails", cli->rails, "NICs (endpoints) per rank; writes stripe over them");
  cmd->add_flag("--reorder", cli->reorder, "run through the reorder shim (EFA SRD semantics)");
  cmd->add_option("--sizes", cli->bench.sizes, "write sizes in bytes (default 4 KiB..1 MiB)");
  cmd->add_option("--window", cli->bench.window, "writes in flight")->capture_default_str();
  cmd->add_option("--reps", cli->bench.reps, "timed bandwidth repetitions per size")
      ->capture_default_str();
  cmd->add_option("--bytes-per-rep", cli->bench.bytes_per_rep, "bytes streamed per repetition")
      ->capture_default_str();
  cmd->add_option("--latency-iters", cli->bench.latency_iters, "timed ping-pongs per size")
      ->capture_default_str();
  cmd->add_option("--timeout-ms", cli->bench.timeout_ms, "deadline of every wait")
      ->capture_default_str();
  cmd->add_flag("--json", cli->json, "print one JSON document (rank 0) on stdout");
  cmd->callback([cli, &action] {
    action = [cli] {
      if (!self_launch::under_launcher()) return self_launch::relaunch_as_ranks(2, 2);
      return run_fabric_bench_rank(*cli);
    };
  });
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "benchmarks (each reports medians and p99)");
  bench->require_subcommand(1);
  register_bench_fabric(*bench, action);
  register_bench_proxy(*bench, action);
  register_bench_ring(*bench, action);
}

}  // namespace proxyep::tools
