#include "daemon/daemon_metrics.hpp"

#include "proxy/engine/thread_metrics.hpp"

#include <string>

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
  for (const auto& entry : entries) {
    const ServedRank& rank = *entry.rank;
    const std::string rank_label = std::to_string(rank.rank()), pid = std::to_string(entry.pid);
    proxy::collect_thread_metrics(sink, rank.thread_stats(), rank.ranks(),
                                  {{"rank", rank_label}, {"pid", pid}});
    // Set once at the attach (ServedRank's constructor), read-only afterwards.
    constexpr const char* kDeviceHelp =
        "1 when the client's device memory is registered for the NIC (GPUDirect RDMA), 0 when "
        "it was offered and declined (the client's host memory serves); only offered memory";
    const auto device_memory = [&](const char* memory, bool offered, bool registered) {
      if (offered)
        sink.gauge("proxyep_daemon_device_memory_registered", kDeviceHelp,
                   {{"rank", rank_label}, {"pid", pid}, {"memory", memory}}, registered ? 1 : 0);
    };
    device_memory("staging", rank.offered_device_staging(), rank.device_staging_registered());
    device_memory("arena", rank.offered_device_arena(), rank.device_arena_registered());
  }
}

}  // namespace proxyep::daemon
