// What a Buffer's metrics endpoint shows (metrics.port; metrics/metrics_exporter.hpp): its
// calls and their phase times, how their rows moved, bytes per peer, and each proxy thread's
// counters. Read on the HTTP server's thread, so only from sources safe to read there: the
// stats the normal mode published after its last call, the channels' byte counters and the
// proxy's atomic counters.
#pragma once

#include "integrations/normal_types.hpp"
#include "metrics/metrics_sink.hpp"
#include "proxy/session/session.hpp"

namespace proxyep::integrations {

void collect_buffer_metrics(metrics::MetricsSink& sink, const BufferStats& published,
                            const proxy::Session& session);

}  // namespace proxyep::integrations
