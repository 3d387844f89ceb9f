// `proxyep launch -n N [--ranks-per-node M] [--timeout S] [--grace-ms MS] [--max-ranks K]
// [--tolerate-failures K] [--master-port P] [--link GBPS[,LATENCY_US] | preset:NAME] -- CMD
// ARGS...`: runs CMD as N local ranks with torchrun's environment and a job id and secret of their
// own (tools/launcher.hpp does the work, and checks the whole launch before it starts anything;
// with --link, on the testbed: tools/testbed/testbed_launch.hpp).
#include "common/params.hpp"
#include "common/registry.hpp"
#include "tools/cli_checks.hpp"
#include "tools/commands.hpp"
#include "tools/launcher.hpp"
#include "tools/testbed/link_option.hpp"
#include "tools/testbed/testbed_launch.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <memory>

namespace proxyep::tools {
namespace {

struct LaunchArgs {
  int ranks = 0;
  int ranks_per_node = 0;
  double timeout_s = 0;
  int64_t grace_ms = 3000;
  int tolerate_failures = 0;
  int master_port = 0;
  int64_t max_ranks = 0;  // 0 = the launch.max_ranks parameter
  std::vector<std::string> command;
};

// Parameters given to this launcher by --set or --config reach the ranks as PROXYEP_* variables
// (the ranks' registries read their environment), so `proxyep --set x=y launch ...` means what
// it says.
std::vector<std::pair<std::string, std::string>> forwarded_parameters() {
  std::vector<std::pair<std::string, std::string>> env;
  for (auto* param : config::Registry::global().all()) {
    if (param == &params::launch_link) continue;  // the launcher's own: the ranks launch nothing
    auto source = param->source();
    if (source == config::Source::command_line || source == config::Source::config_file)
      env.emplace_back(param->env_name(), param->value_string());
  }
  return env;
}

int run_launch(const LaunchArgs& args) {
  if (args.max_ranks > 0)
    params::launch_max_ranks.set(args.max_ranks, config::Source::command_line);
  LaunchOptions options;
  options.ranks = args.ranks;
  options.ranks_per_node = args.ranks_per_node;
  options.command = args.command;
  options.timeout = std::chrono::milliseconds(std::llround(args.timeout_s * 1000));
  options.grace = std::chrono::milliseconds(args.grace_ms);
  options.tolerated_failures = args.tolerate_failures;
  options.master_port = args.master_port;
  options.extra_env = forwarded_parameters();
  return testbed::launch(std::move(options), params::launch_link.get()).exit_code;
}

}  // namespace

void register_launch(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "launch", "run a command as N local ranks with torchrun's environment (MASTER_ADDR, ...)");
  auto args = std::make_shared<LaunchArgs>();
  cmd->add_option("-n,--nranks", args->ranks, "number of ranks")
      ->required()
      ->check(cli_checks::at_least(1));
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "ranks per emulated node (LOCAL_WORLD_SIZE); default: all on one node")
      ->check(cli_checks::at_least(1));
  cmd->add_option("--timeout", args->timeout_s,
                  "stop every rank after this many seconds and fail (default: no limit)")
      ->check(cli_checks::real_at_least(0));
  cmd->add_option("--grace-ms", args->grace_ms, "after SIGTERM, wait this long before SIGKILL")
      ->capture_default_str()
      ->check(cli_checks::at_least(0));
  cmd->add_option("--tolerate-failures", args->tolerate_failures,
                  "let this many ranks fail (exit non-zero, or die by a signal) without stopping "
                  "the others, for jobs that survive a rank's loss (low-latency calls with "
                  "enable_shrink); each is reported, and the launch exits 0 when every other "
                  "rank does")
      ->check(cli_checks::at_least(0));
  cmd->add_option("--max-ranks", args->max_ranks,
                  "raise (or lower) the cap on ranks on this machine (launch.max_ranks, default "
                  "256); larger -n is refused before anything starts")
      ->check(cli_checks::accepted_by(params::launch_max_ranks));
  cmd->add_option("--master-port", args->master_port,
                  "rendezvous port of rank 0 (MASTER_PORT); default: a free loopback port")
      ->check(cli_checks::in_range(1, 65535));
  testbed::add_link_option(*cmd);
  cmd->add_option("command", args->command, "the command and its arguments, after --")->required();
  cmd->footer(
      "Each rank's output lines are prefixed with \"[rank k] \". When a rank fails, the others "
      "get SIGTERM (SIGKILL after the grace period) and the launcher exits with the failing "
      "rank's code (128+N for signal N; 124 on timeout; 127 if the command cannot run; 128+N "
      "when the launcher gets signal N, while it is still starting ranks too). Shm regions a "
      "dead rank left in /dev/shm are removed.\n"
      "Example: proxyep launch -n 4 --ranks-per-node 2 -- ./fabric_alltoall --provider shm\n");
  cmd->callback([&action, args] { action = [args] { return run_launch(*args); }; });
}

}  // namespace proxyep::tools
