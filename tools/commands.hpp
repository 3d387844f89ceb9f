// Each `proxyep` subcommand lives in its own cmd_*.cpp and registers itself on the CLI11 app.
#pragma once

#include <functional>

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the files that add options
}  // namespace CLI

namespace proxyep::tools {

// A subcommand's action; its return value is the process exit code.
using Action = std::function<int()>;

// Each register_* adds its subcommand to `app` and stores its action in `action` when chosen.
void register_config(CLI::App& app, Action& action);
void register_info(CLI::App& app, Action& action);
void register_launch(CLI::App& app, Action& action);
void register_bench(CLI::App& app, Action& action);
void register_status(CLI::App& app, Action& action);
void register_tune(CLI::App& app, Action& action);
void register_rl(CLI::App& app, Action& action);          // cmd_rl.cpp: hands over to Python
void register_bench_rl(CLI::App& bench, Action& action);  // cmd_rl.cpp

}  // namespace proxyep::tools
