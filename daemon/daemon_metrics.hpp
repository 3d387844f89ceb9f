// The daemon's metric families (served by metrics::MetricsExporter when metrics.port >= 0).
// Runs on the HTTP thread: reads DaemonStats' atomics only.
//
//   proxyep_daemon_clients_attached                     gauge
//   proxyep_daemon_connections_total{outcome=accepted|refused|bad_handshake}   counter
//   proxyep_daemon_draining                             gauge, 1 once SIGTERM/SIGINT arrived
//   proxyep_daemon_uptime_seconds                       gauge
#pragma once

#include "daemon/daemon_stats.hpp"
#include "metrics/metrics_sink.hpp"

namespace proxyep::daemon {

void collect_daemon_metrics(metrics::MetricsSink& sink, const DaemonStats& stats);

}  // namespace proxyep::daemon
