// `proxyep`: the command-line front end. Global options feed the parameter registry
// (--config FILE, --set name=value); subcommands live in cmd_*.cpp.
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/registry.hpp"
#include "tools/commands.hpp"
#include "tools/self_launch.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  using namespace proxyep;
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    auto& registry = config::Registry::global();
    if (!config_file.empty()) registry.load_file(config_file);
    for (const auto& item : overrides) {
      auto eq = item.find('=');
      require(eq != std::string::npos, "config", "--set expects name=value, got '{}'", item);
      registry.set(item.substr(0, eq), item.substr(eq + 1), config::Source::command_line);
    }
    registry.ensure_environment_loaded();
    return action ? action() : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "proxyep: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "proxyep: unexpected error: %s\n", e.what());
    return 1;
  }
}
