// The proxy threads' counters as metric samples: what a Buffer's endpoint shows for its own
// threads (integrations/buffer_metrics.cpp) and what proxyepd shows for every rank it proxies
// (daemon/daemon_metrics.cpp), one set of families for both. A template over the sink (anything
// with counter/gauge/histogram(name, help, labels, value) and nested Label and Histogram types,
// i.e. metrics::MetricsSink), because proxy/ does not link the metrics library.
//
// Families (labels: thread, plus the caller's `labels`, e.g. the rank a daemon serves):
//   proxyep_proxy_descriptors_total, _writes_posted_total, _completions_total{side},
//   _writes_in_flight, _backlogged_writes_total, _idle_sleeps_total, _passes_total,
//   _driven_passes_total, _bytes_posted_total, _cq_errors_total, _busy_seconds_total,
//   _cpu_seconds_total, _write_latency_seconds (histogram);
//   proxyep_peer_last_completion_age_seconds{peer}.
// Read from the sink's thread while the proxy runs: ThreadStats are snapshots of relaxed atomics.
#pragma once

#include "proxy/engine/latency_histogram.hpp"
#include "proxy/engine/proxy_thread.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::proxy {

template <typename Sink>
typename Sink::Histogram latency_metric(const LatencyHistogram::Snapshot& s) {
  typename Sink::Histogram h;
  uint64_t below = 0;
  for (int b = 0; b < LatencyHistogram::kBuckets; ++b) {
    below += s.counts[static_cast<size_t>(b)];
    h.upper_bounds.push_back(LatencyHistogram::Snapshot::upper_bound_seconds(b));
    h.cumulative.push_back(below);
  }
  // A scrape may catch a sample's bucket before its count (relaxed counters).
  h.count = std::max(s.count, below + s.counts.back());
  h.sum = static_cast<double>(s.sum_ns) * 1e-9;
  return h;
}

// Every thread's families, and per peer of `ranks` the age of its last completed write.
template <typename Sink>
void collect_thread_metrics(Sink& sink, const std::vector<ThreadStats>& threads, int ranks,
                            const std::vector<typename Sink::Label>& labels = {}) {
  using Label = typename Sink::Label;
  constexpr double kSecondsPerNs = 1e-9;
  auto with = [&](std::vector<Label> more) {
    more.insert(more.end(), labels.begin(), labels.end());
    return more;
  };
  for (size_t t = 0; t < threads.size(); ++t) {
    const ThreadStats& s = threads[t];
    const std::string index = std::to_string(t);
    const std::vector<Label> thread = with({{"thread", index}});
    sink.counter("proxyep_proxy_descriptors_total", "Descriptors popped from the rings", thread,
                 static_cast<double>(s.descriptors));
    sink.counter("proxyep_proxy_writes_posted_total", "Writes the provider accepted", thread,
                 static_cast<double>(s.posted));
    for (const auto& [side, count] :
         {std::pair{"local", s.completed}, std::pair{"remote", s.remote}})
      sink.counter("proxyep_proxy_completions_total",
                   "Completions: of this rank's writes (local) and of peers' writes here (remote)",
                   with({{"thread", index}, {"side", side}}), static_cast<double>(count));
    sink.gauge("proxyep_proxy_writes_in_flight", "Writes posted and not yet completed", thread,
               static_cast<double>(s.posted - std::min(s.posted, s.completed)));
    sink.counter("proxyep_proxy_backlogged_writes_total",
                 "Writes that waited in the backlog (provider or credits full)", thread,
                 static_cast<double>(s.backlogged));
    sink.counter("proxyep_proxy_idle_sleeps_total", "Times the thread slept on its doorbells",
                 thread, static_cast<double>(s.sleeps));
    sink.counter("proxyep_proxy_passes_total", "Loop passes (a heartbeat)", thread,
                 static_cast<double>(s.passes));
    sink.counter("proxyep_proxy_driven_passes_total",
                 "Passes a waiting caller ran in the thread's place", thread,
                 static_cast<double>(s.driven));
    sink.counter("proxyep_proxy_bytes_posted_total", "Payload bytes of the writes posted", thread,
                 static_cast<double>(s.bytes_posted));
    sink.counter("proxyep_proxy_cq_errors_total", "Error completions read from the CQs", thread,
                 static_cast<double>(s.cq_errors));
    sink.counter("proxyep_proxy_busy_seconds_total",
                 "Time in passes that did work (busy ratio: its rate)", thread,
                 static_cast<double>(s.busy_ns) * kSecondsPerNs);
    sink.counter("proxyep_proxy_cpu_seconds_total",
                 "CPU time the thread used, spinning included (kernel clock ticks)", thread,
                 static_cast<double>(s.cpu_ns) * kSecondsPerNs);
    sink.histogram("proxyep_proxy_write_latency_seconds",
                   "Time from posting a write to its local completion", thread,
                   latency_metric<Sink>(s.latency));
  }
  // Per peer on another node: seconds since a write to it last completed here (none yet: no
  // sample). With writes outstanding, a growing age is a peer or path that stopped moving.
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  for (int r = 0; r < ranks; ++r) {
    int64_t last = 0;
    for (const ThreadStats& t : threads)
      if (static_cast<size_t>(r) < t.last_completion_ns.size())
        last = std::max(last, t.last_completion_ns[static_cast<size_t>(r)]);
    if (last == 0) continue;
    sink.gauge("proxyep_peer_last_completion_age_seconds",
               "Seconds since a write to the peer last completed (peers on other nodes)",
               with({{"peer", std::to_string(r)}}),
               static_cast<double>(std::max<int64_t>(now - last, 0)) * kSecondsPerNs);
  }
}

}  // namespace proxyep::proxy
