// `proxyep config`: every parameter, its value, where the value came from and what is valid.
// Invalid values never get this far: main() loads the config file, --set and the environment
// first, and the registry refuses them there, naming each one (exit code 1).
#include "common/registry.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace proxyep::tools {

void register_config(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("config", "print every parameter, its value and its source");
  auto json = std::make_shared<bool>(false);
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_flag("--markdown", *markdown, "the table of docs/CONFIG.md (defaults, not values)");
  cmd->callback([&action, json, markdown] {
    action = [json, markdown] {
      auto& registry = config::Registry::global();
      if (*json) {
        fmt::print("{}\n", registry.to_json().dump(2));
        return 0;
      }
      if (*markdown) {
        fmt::print("| parameter | environment | type | default | valid | description |\n");
        fmt::print("|---|---|---|---|---|---|\n");
        for (auto* p : registry.all())
          fmt::print("| `{}` | `{}` | {} | `{}` | {} | {} |\n", p->name(), p->env_name(),
                     p->type_name(), p->default_string(), p->valid_text(), p->description());
        return 0;
      }
      for (auto* p : registry.all()) {
        fmt::print("{:<32} = {:<12} [{}]  ({}, {} {}, default {})\n    {}\n", p->name(),
                   p->value_string(), config::to_string(p->source()), p->env_name(), p->type_name(),
                   p->valid_text(), p->default_string(), p->description());
      }
      return 0;
    };
  });
}

}  // namespace proxyep::tools
