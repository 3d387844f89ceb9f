// Everything a Daemon needs to start, read once from the parameter registry (daemon.*,
// metrics.*) so the daemon itself never reads parameters while it serves. Tests fill it
// directly.
#pragma once

#include "daemon/access_policy.hpp"

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace proxyep::daemon {

struct DaemonOptions {
  std::string socket_path = "/run/proxyep/proxyepd.sock";
  mode_t socket_mode = 0660;
  std::chrono::milliseconds io_timeout{5000};
  std::chrono::milliseconds drain_timeout{10000};
  AccessPolicy access = AccessPolicy::from_lists("", "", ::getuid());  // own uid and root
  int max_connections = 256;
  int metrics_port = -1;  // -1: off; 0: any free port; N: port N as given (no LOCAL_RANK offset)
  std::string metrics_address = "127.0.0.1";
  // Take SIGTERM/SIGINT as the request to drain (signal_watch.hpp). Off for a daemon embedded
  // in a test process, which calls Daemon::request_drain() instead.
  bool handle_signals = true;

  // From daemon.socket, daemon.socket_mode, daemon.io_timeout_ms, daemon.drain_timeout_ms,
  // daemon.allow_uids/gids, daemon.max_connections, metrics.port and metrics.address.
  // Throws proxyep::Error for an id list that does not parse.
  static DaemonOptions from_params();
};

}  // namespace proxyep::daemon
