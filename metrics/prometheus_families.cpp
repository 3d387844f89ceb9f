// MetricsSink -> prometheus::MetricFamily (prometheus_families.hpp).
#include "metrics/prometheus_families.hpp"

#include <limits>

namespace proxyep::metrics {

std::vector<prometheus::MetricFamily> to_prometheus(const MetricsSink& sink) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(sink.families().size());
  for (const MetricsSink::Family& family : sink.families()) {
    prometheus::MetricFamily f;
    f.name = family.name;
    f.help = family.help;
    f.type = family.kind == Kind::counter ? prometheus::MetricType::Counter
             : family.kind == Kind::gauge ? prometheus::MetricType::Gauge
                                          : prometheus::MetricType::Histogram;
    for (const MetricsSink::Sample& sample : family.samples) {
      prometheus::ClientMetric m;
      for (const Label& label : sample.labels)
        m.label.push_back({label.name, label.value});
      switch (family.kind) {
        case Kind::counter:
          m.counter.value = sample.value;
          break;
        case Kind::gauge:
          m.gauge.value = sample.value;
          break;
        case Kind::histogram: {
          const Histogram& h = sample.histogram;
          m.histogram.sample_count = h.count;
          m.histogram.sample_sum = h.sum;
          for (size_t b = 0; b < h.upper_bounds.size(); ++b)
            m.histogram.bucket.push_back({h.cumulative[b], h.upper_bounds[b]});
          m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
          break;
        }
      }
      f.metric.push_back(std::move(m));
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace proxyep::metrics
