// `proxyep`: the command-line front end. Global options feed the parameter registry
// (--config FILE, --set name=value); subcommands live in cmd_*.cpp.
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/registry.hpp"
#include "common/signal_hygiene.hpp"
#include "tools/commands.hpp"
#include "tools/load_parameters.hpp"
#include "tools/self_launch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <new>
#include <optional>

namespace {

using namespace proxyep;

// CLI11 answers `proxyep nonsense` (and `proxyep bench nonsense`) with "A subcommand is
// required", which does not say that the word was taken for a command, nor which commands exist.
std::optional<std::string> unknown_command(CLI::App& app) {
  CLI::App* level = &app;
  while (!level->get_subcommands().empty())
    level = level->get_subcommands().front();
  auto rest = level->remaining();
  auto choices = level->get_subcommands([](CLI::App*) { return true; });
  if (rest.empty() || rest.front().starts_with("-") || choices.empty()) return std::nullopt;
  std::vector<std::string> names;
  for (const auto* choice : choices)
    names.push_back(choice->get_name());
  std::string where = level == &app ? "proxyep" : "proxyep " + level->get_name();
  return fmt::format("{}: unknown command '{}' (commands: {})", where, rest.front(),
                     fmt::join(names, ", "));
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: SIGTERM must stop this process, not run exit(1) in a PSM library.
  restore_signals_taken_by_libraries();
  tools::self_launch::remember_argv(argc, argv);
  CLI::App app{"ProxyEP: CPU-proxy expert-parallel transport runtime"};
  app.require_subcommand(1);
  std::string config_file;
  std::vector<std::string> overrides;
  app.add_option("--config", config_file, "JSON file of parameter values")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "set a parameter: --set fabric.provider=tcp (repeatable)");

  tools::Action action;
  tools::register_config(app, action);
  tools::register_info(app, action);
  tools::register_launch(app, action);
  tools::register_bench(app, action);
  tools::register_status(app, action);
  tools::register_tune(app, action);
  tools::register_rl(app, action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (auto unknown = unknown_command(app)) {
      std::fprintf(stderr, "%s\nRun with --help for more information.\n", unknown->c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
    return app.exit(e);
  }
  try {
    tools::load_parameters(config_file, overrides);
    return action ? action() : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "proxyep: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // Sizes are checked before the large allocations; this is what slips through.
    std::fprintf(stderr,
                 "proxyep: error: out of memory (an allocation failed: the workload needs more "
                 "memory than this machine gives the process)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "proxyep: unexpected error: %s\n", e.what());
    return 1;
  }
}
