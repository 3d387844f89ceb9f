// `proxyep status`: asks the node's proxyepd how it is (daemon/status_client.hpp) and prints a
// short summary, or with --json the daemon's status frame as it came. When no daemon answers it
// fails within --timeout-ms, naming the socket and the reason (exit code 1).
#include "common/params.hpp"
#include "daemon/status_client.hpp"
#include "tools/commands.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace proxyep::tools {
namespace {

struct StatusOptions {
  std::string socket;  // empty: daemon.socket
  bool json = false;
  int timeout_ms = 2000;
};

void print_summary(const nlohmann::json& s) {
  const auto& c = s.at("connections");
  fmt::print("proxyepd pid {} (uid {}), up {:.0f} s, serving {}\n", s.at("pid").get<int64_t>(),
             s.at("uid").get<int64_t>(), s.at("uptime_s").get<double>(),
             s.at("socket").get<std::string>());
  fmt::print("  build {}, protocol version {}, started {}\n",
             s.at("build_version").get<std::string>(), s.at("version").get<int64_t>(),
             s.at("started_at").get<std::string>());
  fmt::print("  clients attached: {}; connections: {} accepted, {} refused, {} bad handshakes\n",
             s.at("clients_attached").get<int64_t>(), c.at("accepted").get<int64_t>(),
             c.at("refused").get<int64_t>(), c.at("bad_handshake").get<int64_t>());
  const auto& url = s.at("metrics_url");
  fmt::print("  draining: {}; metrics: {}\n", s.at("draining").get<bool>() ? "yes" : "no",
             url.is_string() ? url.get<std::string>() : std::string("off"));
}

int run_status(const StatusOptions& o) {
  const std::string socket = o.socket.empty() ? params::daemon_socket.get() : o.socket;
  const auto answer = daemon::query_status(socket, std::chrono::milliseconds(o.timeout_ms));
  if (o.json)
    fmt::print("{}\n", answer.status.dump(2));
  else
    print_summary(answer.status);
  return 0;
}

}  // namespace

void register_status(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("status", "ask this node's proxyepd how it is");
  auto options = std::make_shared<StatusOptions>();
  cmd->add_option("--socket", options->socket, "the daemon's socket (default: daemon.socket)");
  cmd->add_flag("--json", options->json, "print the daemon's status frame as JSON");
  cmd->add_option("--timeout-ms", options->timeout_ms, "give up after this long (default 2000)")
      ->check(CLI::Range(1, 3600 * 1000));
  cmd->callback([&action, options] { action = [options] { return run_status(*options); }; });
}

}  // namespace proxyep::tools
