// `proxyep launch -n N [--ranks-per-node M] [--timeout S] [--grace-ms MS] [--master-port P] --
// CMD ARGS...`: runs CMD as N local ranks with torchrun's environment and a job id and secret of
// their own (tools/launcher.hpp does the work).
#include "common/registry.hpp"
#include "tools/commands.hpp"
#include "tools/launcher.hpp"

#include <cmath>
#include <memory>

namespace proxyep::tools {
namespace {

struct LaunchArgs {
  int ranks = 0;
  int ranks_per_node = 0;
  double timeout_s = 0;
  int64_t grace_ms = 3000;
  int master_port = 0;
  std::vector<std::string> command;
};

// Parameters given to this launcher by --set or --config reach the ranks as PROXYEP_* variables
// (the ranks' registries read their environment), so `proxyep --set x=y launch ...` means what
// it says.
std::vector<std::pair<std::string, std::string>> forwarded_parameters() {
  std::vector<std::pair<std::string, std::string>> env;
  for (auto* param : config::Registry::global().all()) {
    auto source = param->source();
    if (source == config::Source::command_line || source == config::Source::config_file)
      env.emplace_back(param->env_name(), param->value_string());
  }
  return env;
}

int run_launch(const LaunchArgs& args) {
  LaunchOptions options;
  options.ranks = args.ranks;
  options.ranks_per_node = args.ranks_per_node;
  options.command = args.command;
  options.timeout = std::chrono::milliseconds(std::llround(args.timeout_s * 1000));
  options.grace = std::chrono::milliseconds(args.grace_ms);
  options.master_port = args.master_port;
  options.extra_env = forwarded_parameters();
  LocalLauncher launcher(std::move(options));
  return launcher.run().exit_code;
}

}  // namespace

void register_launch(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "launch", "run a command as N local ranks with torchrun's environment (MASTER_ADDR, ...)");
  auto args = std::make_shared<LaunchArgs>();
  cmd->add_option("-n,--nranks", args->ranks, "number of ranks")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "ranks per emulated node (LOCAL_WORLD_SIZE); default: all on one node")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--timeout", args->timeout_s,
                  "stop every rank after this many seconds and fail (default: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--grace-ms", args->grace_ms, "after SIGTERM, wait this long before SIGKILL")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--master-port", args->master_port,
                  "rendezvous port of rank 0 (MASTER_PORT); default: a free loopback port")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("command", args->command, "the command and its arguments, after --")->required();
  cmd->footer(
      "Each rank's output lines are prefixed with \"[rank k] \". When a rank fails, the others "
      "get SIGTERM (SIGKILL after the grace period) and the launcher exits with the failing "
      "rank's code (128+N for signal N; 124 on timeout; 127 if the command cannot run).\n"
      "Example: proxyep launch -n 4 --ranks-per-node 2 -- ./fabric_alltoall --provider shm\n");
  cmd->callback([&action, args] { action = [args] { return run_launch(*args); }; });
}

}  // namespace proxyep::tools
