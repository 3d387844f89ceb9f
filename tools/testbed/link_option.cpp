#include "tools/testbed/link_option.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "tools/cli_checks.hpp"

#include <CLI/CLI.hpp>

#include <sstream>

namespace proxyep::tools::testbed {

void add_link_option(CLI::App& cmd) {
  cmd.add_option_function<std::string>(
         "--link",
         [](const std::string& link) {
           params::launch_link.set(link, config::Source::command_line);
         },
         "run each emulated node in its own network namespace, the nodes joined by links shaped "
         "to GBPS[,LATENCY_US] (Gbit/s per node and direction, one-way us) or preset:NAME (p5, "
         "p5en, p6-b200: the machine's NVLink:EFA ratio scaled to this box; 8 ranks per node "
         "unless --ranks-per-node); needs CAP_NET_ADMIN (launch.link, docs/TESTBED.md)")
      ->check(cli_checks::accepted_by(params::launch_link));
}

namespace {

// Before the launch (launch.link) or in one of its ranks (testbed.link_gbps).
bool on_testbed() {
  return !params::launch_link.get().empty() || params::testbed_link_gbps.get() > 0;
}

}  // namespace

std::string provider_between_nodes(const std::string& given) {
  if (!given.empty()) return given;
  if (on_testbed() && params::fabric_provider.get() == "auto") return "tcp";
  return params::fabric_provider.get();
}

std::vector<std::string> node_namespaces() {
  std::vector<std::string> names;
  std::istringstream list(params::testbed_namespaces.get());
  for (std::string name; std::getline(list, name, ',');)
    if (!name.empty()) names.push_back(name);
  return names;
}

void check_provider_crosses_links(const std::string& provider, const std::string& phase) {
  if (!on_testbed()) return;
  require(provider != "shm", phase,
          "the shm provider moves bytes between nodes through shared memory, past the shaped links "
          "of --link: use tcp (the default across nodes) to run on the testbed");
}

}  // namespace proxyep::tools::testbed
