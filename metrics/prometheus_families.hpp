// A MetricsSink's families as prometheus-cpp's MetricFamily (what its serialiser and exposer
// take). Only this folder's sources include it: prometheus-cpp stays out of the layers above.
#pragma once

#include "metrics/metrics_sink.hpp"

#include <prometheus/metric_family.h>

#include <vector>

namespace proxyep::metrics {

std::vector<prometheus::MetricFamily> to_prometheus(const MetricsSink& sink);

}  // namespace proxyep::metrics
