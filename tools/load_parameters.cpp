// load_parameters (load_parameters.hpp).
#include "tools/load_parameters.hpp"

#include "common/error.hpp"
#include "common/registry.hpp"

#include <fmt/ranges.h>

namespace proxyep::tools {

void load_parameters(const std::string& config_file, const std::vector<std::string>& overrides,
                     const std::vector<std::pair<std::string, std::string>>& shorthands) {
  auto& registry = config::Registry::global();
  std::vector<std::string> problems;
  auto attempt = [&](auto&& step) {
    try {
      step();
    } catch (const Error& e) {
      problems.push_back(e.message());
    }
  };
  if (!config_file.empty()) attempt([&] { registry.load_file(config_file); });
  for (const auto& item : overrides) {
    attempt([&] {
      auto eq = item.find('=');
      require(eq != std::string::npos, "config", "--set expects name=value, got '{}'", item);
      registry.set(item.substr(0, eq), item.substr(eq + 1), config::Source::command_line);
    });
  }
  for (const auto& item : shorthands)  // (Clang 14 cannot capture structured bindings)
    attempt([&] { registry.set(item.first, item.second, config::Source::command_line); });
  attempt([&] { registry.ensure_environment_loaded(); });
  if (!problems.empty()) fail("config", "{}", fmt::join(problems, "; "));
}

}  // namespace proxyep::tools
