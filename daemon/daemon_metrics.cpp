#include "daemon/daemon_metrics.hpp"

#include "proxy/thread_metrics.hpp"

namespace proxyep::daemon {

void collect_daemon_metrics(metrics::MetricsSink& sink, const DaemonStats& stats,
                            ServedRanks& served) {
  constexpr auto relaxed = std::memory_order_relaxed;
  sink.gauge("proxyep_daemon_clients_attached", "Ranks whose proxy threads run in the daemon", {},
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
  std::vector<ServedRanks::Entry> entries;
  {
    std::lock_guard lock(served.mutex);
    entries = served.entries;
  }
  for (const auto& entry : entries)
    proxy::collect_thread_metrics(
        sink, entry.rank->thread_stats(), entry.rank->ranks(),
        {{"rank", std::to_string(entry.rank->rank())}, {"pid", std::to_string(entry.pid)}});
}

}  // namespace proxyep::daemon
