// The daemon's metric families (served by metrics::MetricsExporter when metrics.port >= 0).
// Runs on the HTTP thread: reads DaemonStats' atomics, and the proxy threads' counters of every
// rank served (relaxed atomics) through ServedRanks, which the loop refreshes.
//
//   proxyep_daemon_clients_attached                     gauge
//   proxyep_daemon_connections_total{outcome=accepted|refused|bad_handshake}   counter
//   proxyep_daemon_draining                             gauge, 1 once SIGTERM/SIGINT arrived
//   proxyep_daemon_uptime_seconds                       gauge
//   proxyep_daemon_device_memory_registered{rank,pid,memory=staging|arena}   gauge, 1 when the
//     client's device memory is registered for the NIC, 0 when it was offered and declined
//   proxyep_proxy_* and proxyep_peer_last_completion_age_seconds (proxy/engine/thread_metrics.hpp)
//   for every rank served, labelled rank and pid (the client's process: ranks of two jobs differ)
#pragma once

#include "daemon/daemon_stats.hpp"
#include "daemon/served_rank.hpp"
#include "metrics/metrics_sink.hpp"

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <vector>

namespace proxyep::daemon {

// The ranks the daemon serves, as the metrics thread sees them: the loop replaces the list
// each turn (under the mutex); a scrape copies it, so a rank the loop lets go mid-scrape lives
// until the scrape is done with it.
struct ServedRanks {
  struct Entry {
    std::shared_ptr<const ServedRank> rank;
    pid_t pid = 0;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
};

void collect_daemon_metrics(metrics::MetricsSink& sink, const DaemonStats& stats,
                            ServedRanks& served);

}  // namespace proxyep::daemon
