#include "daemon/daemon_options.hpp"

#include "common/params.hpp"

#include <unistd.h>

#include <string>

namespace proxyep::daemon {

DaemonOptions DaemonOptions::from_params() {
  DaemonOptions o;
  o.socket_path = params::daemon_socket.get();
  // The parameter accepts octal 0000..0777 only (common/params.cpp).
  o.socket_mode = static_cast<mode_t>(std::stoul(params::daemon_socket_mode.get(), nullptr, 8));
  o.io_timeout = std::chrono::milliseconds(params::daemon_io_timeout_ms.get());
  o.drain_timeout = std::chrono::milliseconds(params::daemon_drain_timeout_ms.get());
  o.access = AccessPolicy::from_lists(params::daemon_allow_uids.get(),
                                      params::daemon_allow_gids.get(), ::getuid());
  o.max_connections = static_cast<int>(params::daemon_max_connections.get());
  o.metrics_port = static_cast<int>(params::metrics_port.get());
  o.metrics_address = params::metrics_address.get();
  return o;
}

}  // namespace proxyep::daemon
