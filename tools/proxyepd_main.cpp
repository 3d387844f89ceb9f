// `proxyepd`: the per-node proxy daemon (docs/DAEMON.md). Parameters come from the same
// registry as `proxyep`'s (--config FILE, --set name=value, PROXYEP_* variables); --socket,
// --metrics-port, --proxy-threads and --cpus are shorthands for daemon.socket, metrics.port,
// proxy.threads and proxy.cpus that win over --set (and so over every config file, the tuned
// one of `proxyep tune` included, and the environment). Serves
// until SIGTERM/SIGINT, drains, exits 0; exits 1 with "proxyepd: error: ..." when it cannot
// start (the socket is served by another daemon, a parameter is invalid, ...).
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "common/signal_hygiene.hpp"
#include "daemon/daemon.hpp"
#include "tools/cli_checks.hpp"
#include "tools/load_parameters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

using namespace proxyep;

int main(int argc, char** argv) {
  // Before anything else: SIGTERM must stop this process, not run exit(1) in a PSM library.
  restore_signals_taken_by_libraries();
  CLI::App app{
      "proxyepd: the ProxyEP node daemon (serves the proxy threads of the ranks that attach, "
      "their status and metrics)"};
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
  std::optional<std::string> proxy_threads;
  std::optional<std::string> cpus;
  app.add_option("--proxy-threads", proxy_threads,
                 "proxy threads of the daemon's engine (proxy.threads; 0 = one per NIC)")
      ->check(tools::cli_checks::accepted_by(params::proxy_threads));
  app.add_option("--cpus", cpus,
                 "CPUs the proxy threads are pinned to, a cpu list like 2-3,6 (proxy.cpus)")
      ->check(tools::cli_checks::accepted_by(params::proxy_cpus));
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<std::pair<std::string, std::string>> shorthands;
    if (socket) shorthands.emplace_back("daemon.socket", *socket);
    if (metrics_port) shorthands.emplace_back("metrics.port", std::to_string(*metrics_port));
    if (proxy_threads) shorthands.emplace_back(params::proxy_threads.name(), *proxy_threads);
    if (cpus) shorthands.emplace_back(params::proxy_cpus.name(), *cpus);
    tools::load_parameters(config_file, overrides, shorthands);
    // Where the placement came from (a tuned file, the environment, these flags): an operator's
    // first question when the proxy threads do not run where expected.
    log::info("proxyepd: proxy.threads = {} ({}), proxy.pin = {} ({}), proxy.cpus = '{}' ({})",
              params::proxy_threads.value_string(),
              config::to_string(params::proxy_threads.source()), params::proxy_pin.value_string(),
              config::to_string(params::proxy_pin.source()), params::proxy_cpus.value_string(),
              config::to_string(params::proxy_cpus.source()));
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
