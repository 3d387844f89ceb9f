// The Buffer's metric families (buffer_metrics.hpp).
#include "integrations/buffer_metrics.hpp"

#include <algorithm>
#include <chrono>
#include <string>

namespace proxyep::integrations {

namespace {

using metrics::Label;
using metrics::MetricsSink;

constexpr double kSecondsPerNs = 1e-9;

void collect_calls(MetricsSink& sink, const BufferStats& s) {
  struct Kind {
    const char* name;
    const PhaseTimes& times;
  };
  for (const Kind& kind :
       {Kind{"dispatch", s.dispatch_phases}, Kind{"combine", s.combine_phases}}) {
    const auto& t = kind.times;
    sink.counter("proxyep_calls_total", "Normal-mode calls completed", {{"kind", kind.name}},
                 static_cast<double>(t.calls));
    struct Phase {
      const char* name;
      uint64_t ns;
    };
    for (const Phase& phase :
         {Phase{"prepare", t.prepare_ns}, Phase{"notify", t.notify_ns}, Phase{"pack", t.pack_ns},
          Phase{"post", t.post_ns}, Phase{"local", t.local_ns}, Phase{"unpack", t.unpack_ns},
          Phase{"wait", t.wait_ns}, Phase{"reduce", t.reduce_ns}, Phase{"quiet", t.quiet_ns}})
      sink.counter("proxyep_call_phase_seconds_total",
                   "Time the completed calls spent in each phase (bench ep --breakdown's phases)",
                   {{"kind", kind.name}, {"phase", phase.name}},
                   static_cast<double>(phase.ns) * kSecondsPerNs);
  }
  struct Count {
    const char* name;
    const char* help;
    uint64_t value;
  };
  for (const Count& c : {
           Count{"proxyep_eager_streams_total",
                 "Rank pairs whose rows went with the notify record (ep.eager_bytes)",
                 s.eager_streams},
           Count{"proxyep_chunks_sent_total", "Chunks sent to peers", s.chunks_sent},
           Count{"proxyep_chunks_received_total", "Chunks received from peers", s.chunks_received},
           Count{"proxyep_credit_stalls_total",
                 "Times a stream with chunks left waited for a credit or a free slot",
                 s.credit_stalls},
           Count{"proxyep_chunks_reduced_in_place_total",
                 "Combine chunks reduced where they landed", s.chunks_reduced_in_place},
           Count{"proxyep_rows_stored_in_place_total",
                 "Dispatch rows stored straight into a node peer's recv_x", s.rows_stored_in_place},
           Count{"proxyep_chunks_sent_from_x_total",
                 "Combine chunks written to other nodes straight from the caller's x",
                 s.chunks_sent_from_caller},
       })
    sink.counter(c.name, c.help, {}, static_cast<double>(c.value));
}

void collect_peers(MetricsSink& sink, const proxy::Session& session) {
  for (int r = 0; r < session.ranks(); ++r) {
    if (r == session.rank()) continue;
    const proxy::PeerChannel& to = session.channel(r);
    sink.counter("proxyep_peer_sent_bytes_total",
                 "Payload bytes sent to each peer (records' eager rows and chunks)",
                 {{"peer", std::to_string(r)},
                  {"path", to.path() == proxy::PeerPath::node ? "node" : "fabric"}},
                 static_cast<double>(to.bytes_sent()));
  }
}

metrics::Histogram latency_histogram(const proxy::LatencyHistogram::Snapshot& s) {
  metrics::Histogram h;
  uint64_t below = 0;
  for (int b = 0; b < proxy::LatencyHistogram::kBuckets; ++b) {
    below += s.counts[static_cast<size_t>(b)];
    h.upper_bounds.push_back(proxy::LatencyHistogram::Snapshot::upper_bound_seconds(b));
    h.cumulative.push_back(below);
  }
  // A scrape may catch a sample's bucket before its count (relaxed counters).
  h.count = std::max(s.count, below + s.counts.back());
  h.sum = static_cast<double>(s.sum_ns) * kSecondsPerNs;
  return h;
}

// Per peer on another node: seconds since a write to it last completed here (none yet: no
// sample). With writes outstanding, a growing age is a peer or path that stopped moving.
void collect_peer_progress(MetricsSink& sink, const std::vector<proxy::ThreadStats>& threads,
                           const proxy::Session& session) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  for (int r = 0; r < session.ranks(); ++r) {
    int64_t last = 0;
    for (const proxy::ThreadStats& t : threads)
      if (static_cast<size_t>(r) < t.last_completion_ns.size())
        last = std::max(last, t.last_completion_ns[static_cast<size_t>(r)]);
    if (last == 0) continue;
    sink.gauge("proxyep_peer_last_completion_age_seconds",
               "Seconds since a write to the peer last completed (peers on other nodes)",
               {{"peer", std::to_string(r)}},
               static_cast<double>(std::max<int64_t>(now - last, 0)) * kSecondsPerNs);
  }
}

void collect_proxy(MetricsSink& sink, const proxy::Session& session) {
  const std::vector<proxy::ThreadStats> threads = session.proxy_thread_stats();
  sink.gauge("proxyep_proxy_threads", "Proxy threads draining this rank's rings (0: one node)", {},
             static_cast<double>(threads.size()));
  sink.gauge("proxyep_proxy_failed", "1 once the proxy failed (the Buffer must be recreated)", {},
             session.proxy_failed() ? 1 : 0);
  for (size_t t = 0; t < threads.size(); ++t) {
    const proxy::ThreadStats& s = threads[t];
    const std::vector<Label> thread{{"thread", std::to_string(t)}};
    sink.counter("proxyep_proxy_descriptors_total", "Descriptors popped from the rings", thread,
                 static_cast<double>(s.descriptors));
    sink.counter("proxyep_proxy_writes_posted_total", "Writes the provider accepted", thread,
                 static_cast<double>(s.posted));
    for (const auto& [side, count] :
         {std::pair{"local", s.completed}, std::pair{"remote", s.remote}})
      sink.counter("proxyep_proxy_completions_total",
                   "Completions: of this rank's writes (local) and of peers' writes here (remote)",
                   {{"thread", std::to_string(t)}, {"side", side}}, static_cast<double>(count));
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
                   latency_histogram(s.latency));
  }
  collect_peer_progress(sink, threads, session);
}

}  // namespace

void collect_buffer_metrics(MetricsSink& sink, const BufferStats& published,
                            const proxy::Session& session) {
  collect_calls(sink, published);
  collect_peers(sink, session);
  collect_proxy(sink, session);
}

}  // namespace proxyep::integrations
