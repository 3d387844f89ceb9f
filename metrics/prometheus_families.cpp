// MetricsSink -> prometheus::MetricFamily (prometheus_families.hpp).
#include "metrics/prometheus_families.hpp"

namespace proxyep::metrics {

std::vector<prometheus::MetricFamily> to_prometheus(const MetricsSink& sink) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(sink.families().size());
  for (const MetricsSink::Family& family : sink.families()) {
    prometheus::MetricFamily f;
    f.name = family.name;
    f.help = family.help;
    f.type = family.kind == Kind::counter ? prometheus::MetricType::Counter
                                          : prometheus::MetricType::Gauge;
    for (const MetricsSink::Sample& sample : family.samples) {
      prometheus::ClientMetric m;
      for (const Label& label : sample.labels)
        m.label.push_back({label.name, label.value});
      if (family.kind == Kind::counter)
        m.counter.value = sample.value;
      else
        m.gauge.value = sample.value;
      f.metric.push_back(std::move(m));
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace proxyep::metrics
