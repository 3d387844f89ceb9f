// MetricsSink (metrics_sink.hpp): grouping, name checks and the text format, through
// prometheus-cpp.
#include "metrics/metrics_sink.hpp"

#include "common/error.hpp"
#include "metrics/prometheus_families.hpp"

#include <prometheus/check_names.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

namespace proxyep::metrics {

namespace {

constexpr const char* kPhase = "metrics";

}  // namespace

MetricsSink::Sample& MetricsSink::add(Kind kind, std::string_view name, std::string_view help,
                                      std::vector<Label> labels, double value) {
  for (const Label& label : labels)
    require(prometheus::CheckLabelName(label.name), kPhase, "metric {}: invalid label name '{}'",
            name, label.name);
  auto family = std::find_if(families_.begin(), families_.end(),
                             [&](const Family& f) { return f.name == name; });
  if (family == families_.end()) {
    require(prometheus::CheckMetricName(std::string(name)), kPhase, "invalid metric name '{}'",
            name);
    families_.push_back(Family{std::string(name), std::string(help), kind, {}});
    family = families_.end() - 1;
  } else {
    require(family->kind == kind && family->help == help, kPhase,
            "metric {} given as two kinds or with two help texts", name);
  }
  labels.insert(labels.begin(), common_.begin(), common_.end());
  family->samples.push_back(Sample{std::move(labels), value, {}});
  return family->samples.back();
}

void MetricsSink::histogram(std::string_view name, std::string_view help, std::vector<Label> labels,
                            Histogram histogram) {
  const Histogram& h = histogram;
  require(h.upper_bounds.size() == h.cumulative.size(), kPhase,
          "histogram {}: {} bounds, {} counts", name, h.upper_bounds.size(), h.cumulative.size());
  for (size_t b = 0; b < h.upper_bounds.size(); ++b) {
    require(
        b == 0 ||
            (h.upper_bounds[b] > h.upper_bounds[b - 1] && h.cumulative[b] >= h.cumulative[b - 1]),
        kPhase, "histogram {}: bounds must increase and counts accumulate (bucket {})", name, b);
    require(h.cumulative[b] <= h.count, kPhase, "histogram {}: bucket {} counts more than all",
            name, b);
  }
  add(Kind::histogram, name, help, std::move(labels), 0).histogram = std::move(histogram);
}

std::string MetricsSink::text() const {
  return prometheus::TextSerializer().Serialize(to_prometheus(*this));
}

}  // namespace proxyep::metrics
