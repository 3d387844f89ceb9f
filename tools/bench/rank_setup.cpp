#include "tools/bench/rank_setup.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "fabric/provider.hpp"
#include "tools/cli_checks.hpp"
#include "tools/self_launch.hpp"
#include "tools/testbed/link_option.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

namespace proxyep::tools {

void add_fabric_cli_options(CLI::App& cmd, FabricCli& cli, bool with_rails) {
  cmd.add_option("--provider", cli.provider, "libfabric provider (shm, tcp, efa, ...)");
  if (with_rails)
    cmd.add_option("--rails", cli.rails, "NICs (endpoints) per rank; writes stripe over them")
        ->check(cli_checks::accepted_by(params::fabric_rails));
  cmd.add_flag("--reorder", cli.reorder, "run through the reorder shim (EFA SRD semantics)");
  cmd.add_flag("--json", cli.json, "print one JSON document (rank 0) on stdout");
}

void check_fabric_cli(const FabricCli& cli, const std::string& phase) {
  const std::string provider = testbed::provider_between_nodes(cli.provider);
  const int64_t rails = cli.rails > 0 ? cli.rails : params::fabric_rails.get();
  try {
    fabric::select_domains(provider, params::fabric_domain.get(), static_cast<int>(rails));
  } catch (const Error& e) {
    fail(phase, "{}", e.message());
  }
}

ConnectedRank connect_rank(const FabricCli& cli, const std::string& phase) {
  const auto provider = testbed::provider_between_nodes(cli.provider);
  testbed::check_provider_crosses_links(provider, phase);
  if (provider != params::fabric_provider.get())
    params::fabric_provider.set(provider, config::Source::command_line);
  if (cli.rails > 0) params::fabric_rails.set(cli.rails, config::Source::command_line);
  if (cli.reorder) params::fabric_reorder.set(true, config::Source::command_line);
  ConnectedRank rank;
  rank.bootstrap = control::Bootstrap::from_environment();
  rank.fabric = fabric::Fabric::open(fabric::FabricOptions::from_params(rank.bootstrap->rank()));
  rank.bootstrap->set_progress([fabric = rank.fabric.get()] { fabric->progress(); });
  rank.fabric->connect(rank.bootstrap->allgather(rank.fabric->addresses(), phase + "(addresses)"));
  return rank;
}

int start_two_ranks(const FabricCli& cli, const std::string& phase) {
  check_fabric_cli(cli, phase);
  testbed::check_provider_crosses_links(testbed::provider_between_nodes(cli.provider), phase);
  return self_launch::relaunch_as_ranks(2, params::launch_link.get().empty() ? 2 : 1);
}

int report_results(const FabricCli& cli, int rank, nlohmann::json results,
                   const std::function<void(const nlohmann::json&)>& print) {
  if (rank != 0) return 0;
  results["reorder"] = params::fabric_reorder.get();
  results["requested_provider"] = params::fabric_provider.get();
  if (cli.json)
    fmt::print("{}\n", results.dump(2));
  else
    print(results);
  return 0;
}

}  // namespace proxyep::tools
