#include "daemon/daemon_metrics.hpp"

namespace proxyep::daemon {

void collect_daemon_metrics(metrics::MetricsSink& sink, const DaemonStats& stats) {
  constexpr auto relaxed = std::memory_order_relaxed;
  sink.gauge("proxyep_daemon_clients_attached",
             "Clients attached to the daemon's data path (always 0 in this build: status only)", {},
             static_cast<double>(stats.clients_attached.load(relaxed)));
  constexpr const char* kHelp =
      "Connections by outcome: accepted (welcomed), refused (peer credentials not allowed), "
      "bad_handshake (no usable hello)";
  sink.counter("proxyep_daemon_connections_total", kHelp, {{"outcome", "accepted"}},
               static_cast<double>(stats.accepted.load(relaxed)));
  sink.counter("proxyep_daemon_connections_total", kHelp, {{"outcome", "refused"}},
               static_cast<double>(stats.refused.load(relaxed)));
  sink.counter("proxyep_daemon_connections_total", kHelp, {{"outcome", "bad_handshake"}},
               static_cast<double>(stats.bad_handshake.load(relaxed)));
  sink.gauge("proxyep_daemon_draining",
             "1 once the daemon got SIGTERM/SIGINT and stopped accepting connections", {},
             stats.draining.load(relaxed) ? 1 : 0);
  sink.gauge("proxyep_daemon_uptime_seconds", "Seconds since the daemon started", {},
             stats.uptime_s());
}

}  // namespace proxyep::daemon
