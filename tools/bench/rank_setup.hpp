// What every two-rank fabric benchmark does around its measurement: the shared command-line
// options (provider, rails, reorder shim, --json), joining the ranks, opening and connecting the
// fabric, and printing rank 0's results.
#pragma once

#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the files that add options
}  // namespace CLI

namespace proxyep::tools {

struct FabricCli {
  std::string provider;
  int rails = 0;  // 0 = the fabric.rails parameter
  bool reorder = false;
  bool json = false;
};

// Adds --provider, --reorder, --json (and --rails when `with_rails`) to `cmd`.
void add_fabric_cli_options(CLI::App& cmd, FabricCli& cli, bool with_rails);

// One rank's bootstrap and connected fabric; the fabric is destroyed before the bootstrap.
struct ConnectedRank {
  std::unique_ptr<control::Bootstrap> bootstrap;
  std::unique_ptr<fabric::Fabric> fabric;
};

// Before any rank starts: the provider the ranks will open (--provider, else fabric.provider)
// with fabric.domain and the rails must exist on this host. Throws proxyep::Error(`phase`).
void check_fabric_cli(const FabricCli& cli, const std::string& phase);

// Run alone (no launcher): checks as check_fabric_cli does and, with --link, that the provider
// crosses the shaped links; then starts the benchmark's two ranks, as two nodes on the testbed
// (the link between them is then what it measures), one node otherwise. Returns the exit code.
int start_two_ranks(const FabricCli& cli, const std::string& phase);

// Applies the options to the parameter registry, joins the ranks, opens the fabric and exchanges
// addresses; the bootstrap's waits drive the fabric's progress.
ConnectedRank connect_rank(const FabricCli& cli, const std::string& phase);

// Rank 0: adds the reorder/provider settings to `results` and prints them (JSON or `print`).
int report_results(const FabricCli& cli, int rank, nlohmann::json results,
                   const std::function<void(const nlohmann::json&)>& print);

}  // namespace proxyep::tools
