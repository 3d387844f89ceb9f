// `proxyep rl ...` and `proxyep bench rl ...`: the MoE RL layer is Python (python/proxyep/rl,
// docs/RL.md), so these hand over to `python3 -m proxyep.rl ...` / `python3 -m proxyep.bench rl
// ...` with every argument as given. The interpreter is the one the package was built for, the
// build tree's python/ goes first on PYTHONPATH (an installed package, scripts/install-python.sh,
// works too), and PROXYEP_RL_CLI names this executable so the run launches its ranks with it.
// exec, not a child: signals (SIGTERM to stop a run) reach the Python supervisor directly.
#include "common/error.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace proxyep::tools {
namespace {

int exec_python(const std::vector<std::string>& module_args, const std::vector<std::string>& args) {
#if defined(PROXYEP_PYTHON_EXECUTABLE) && defined(PROXYEP_PYTHON_DIR)
  std::string python_path = PROXYEP_PYTHON_DIR;
  if (const char* existing = std::getenv("PYTHONPATH"); existing && *existing)
    python_path += std::string(":") + existing;
  setenv("PYTHONPATH", python_path.c_str(), 1);
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error && !std::getenv("PROXYEP_RL_CLI")) setenv("PROXYEP_RL_CLI", self.c_str(), 1);
  std::vector<std::string> argv_storage{PROXYEP_PYTHON_EXECUTABLE, "-m"};
  argv_storage.insert(argv_storage.end(), module_args.begin(), module_args.end());
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_storage)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  fmt::print(stderr, "proxyep: cannot run {}: {}\n", argv_storage[0], std::strerror(errno));
  return 127;
#else
  (void)module_args;
  (void)args;
  fmt::print(stderr,
             "proxyep: this build has no Python packages (needs /usr/bin/python3's development "
             "files, pybind11-dev and libdlpack-dev at configure time): the RL layer is Python\n");
  return 127;
#endif
}

}  // namespace

void register_rl(CLI::App& app, Action& action) {
  auto* rl = app.add_subcommand(
      "rl",
      "the MoE RL layer: `proxyep rl run --config FILE` (python3 -m proxyep.rl; --help there)");
  rl->prefix_command();  // everything after `rl` goes to Python unparsed
  rl->set_help_flag();   // and so does --help
  rl->callback(
      [rl, &action] { action = [rl] { return exec_python({"proxyep.rl"}, rl->remaining()); }; });
}

void register_bench_rl(CLI::App& bench, Action& action) {
  auto* cmd = bench.add_subcommand(
      "rl",
      "GRPO rollout throughput: ProxyEP vs all_to_all_single, preemption, scaling "
      "(python3 -m proxyep.bench rl; --help there)");
  cmd->prefix_command();
  cmd->set_help_flag();
  cmd->callback([cmd, &action] {
    action = [cmd] { return exec_python({"proxyep.bench", "rl"}, cmd->remaining()); };
  });
}

}  // namespace proxyep::tools
