// `proxyepd`: the per-node proxy daemon (docs/DAEMON.md). Parameters come from the same
// registry as `proxyep`'s (--config FILE, --set name=value, PROXYEP_* variables); --socket and
// --metrics-port are shorthands for daemon.socket and metrics.port that win over --set. Serves
// until SIGTERM/SIGINT, drains, exits 0; exits 1 with "proxyepd: error: ..." when it cannot
// start (the socket is served by another daemon, a parameter is invalid, ...).
#include "common/error.hpp"
#include "common/registry.hpp"
#include "daemon/daemon.hpp"
#include "tools/load_parameters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

using namespace proxyep;

int main(int argc, char** argv) {
  CLI::App app{
      "proxyepd: the ProxyEP node daemon (this build: the control plane; serves status, "
      "refuses attach)"};
  std::string config_file;
  std::vector<std::string> overrides;
  std::optional<std::string> socket;
  std::optional<int> metrics_port;
  app.add_option("--config", config_file, "JSON file of parameter values")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides,
                 "set a parameter: --set daemon.io_timeout_ms=2000 (repeatable)");
  app.add_option("--socket", socket, "the Unix socket to serve (daemon.socket)");
  app.add_option("--metrics-port", metrics_port,
                 "serve Prometheus metrics on this port (metrics.port: -1 off, 0 any free port)");
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<std::pair<std::string, std::string>> shorthands;
    if (socket) shorthands.emplace_back("daemon.socket", *socket);
    if (metrics_port) shorthands.emplace_back("metrics.port", std::to_string(*metrics_port));
    tools::load_parameters(config_file, overrides, shorthands);
    daemon::Daemon daemon(daemon::DaemonOptions::from_params());
    daemon.run();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "proxyepd: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "proxyepd: unexpected error: %s\n", e.what());
    return 1;
  }
}
