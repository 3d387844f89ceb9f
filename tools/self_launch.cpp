#include "tools/self_launch.hpp"

#include "common/params.hpp"
#include "common/registry.hpp"
#include "tools/launcher.hpp"
#include "tools/testbed/testbed_launch.hpp"

#include <filesystem>
#include <string>
#include <vector>

namespace proxyep::tools::self_launch {
namespace {

std::vector<std::string>& remembered_argv() {
  static std::vector<std::string> argv;
  return argv;
}

}  // namespace

void remember_argv(int argc, char** argv) {
  remembered_argv().assign(argv, argv + argc);
}

bool under_launcher() {
  return config::read_environment("RANK").has_value();
}

int relaunch_as_ranks(int ranks, int ranks_per_node) {
  LaunchOptions options;
  options.ranks = ranks;
  options.ranks_per_node = ranks_per_node;
  // The same binary, whatever name or relative path it was started by.
  options.command = remembered_argv();
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) options.command.at(0) = self.string();
  options.sink = prefixing_sink(/*prefix_rank0=*/false);
  return testbed::launch(std::move(options), params::launch_link.get()).exit_code;
}

}  // namespace proxyep::tools::self_launch
