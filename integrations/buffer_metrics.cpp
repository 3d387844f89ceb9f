// The Buffer's metric families (buffer_metrics.hpp).
#include "integrations/buffer_metrics.hpp"

#include "proxy/engine/thread_metrics.hpp"

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
           Count{"proxyep_chunks_to_fabric_total", "Chunks sent to other nodes",
                 s.chunks_to_fabric},
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
                 {{"peer", std::to_string(r)}, {"path", proxy::path_name(to.path())}},
                 static_cast<double>(to.bytes_sent()));
  }
}

void collect_proxy(MetricsSink& sink, const proxy::Session& session) {
  const std::vector<proxy::ThreadStats> threads = session.proxy_thread_stats();
  sink.gauge("proxyep_proxy_threads", "Proxy threads draining this rank's rings (0: one node)", {},
             static_cast<double>(threads.size()));
  sink.gauge("proxyep_proxy_failed", "1 once the proxy failed (the Buffer must be recreated)", {},
             session.proxy_failed() ? 1 : 0);
  proxy::collect_thread_metrics(sink, threads, session.ranks());
}

}  // namespace

void collect_buffer_metrics(MetricsSink& sink, const BufferStats& published,
                            const proxy::Session& session) {
  collect_calls(sink, published);
  collect_peers(sink, session);
  collect_proxy(sink, session);
}

}  // namespace proxyep::integrations
