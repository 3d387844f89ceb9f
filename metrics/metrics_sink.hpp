// MetricsSink: the samples of one scrape, grouped into families (one name, one help text, one
// kind each), in the order they were first given. Whoever owns what is measured fills a sink
// when the endpoint is scraped (metrics_exporter.hpp); nothing is kept between scrapes, so a
// metric costs nothing until someone asks for it.
//
// Names follow Prometheus' conventions: proxyep_<what>[_<unit>], counters end in _total. Every
// sample of a family must come with the same kind and help; a mismatch or an invalid name is a
// programming error (proxyep::Error("metrics")).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace proxyep::metrics {

struct Label {
  std::string name;
  std::string value;
};

enum class Kind { counter, gauge, histogram };

// A histogram sample: cumulative counts at increasing upper bounds (the +Inf bucket is `count`).
struct Histogram {
  std::vector<double> upper_bounds;
  std::vector<uint64_t> cumulative;  // one per bound
  uint64_t count = 0;
  double sum = 0;
};

class MetricsSink {
 public:
  using Label = metrics::Label;
  using Histogram = metrics::Histogram;
  struct Sample {
    std::vector<Label> labels;
    double value = 0;
    Histogram histogram;  // Kind::histogram only
  };
  struct Family {
    std::string name;
    std::string help;
    Kind kind = Kind::counter;
    std::vector<Sample> samples;
  };

  // `labels` are added to every sample given later (e.g. the rank).
  explicit MetricsSink(std::vector<Label> labels = {}) : common_(std::move(labels)) {}

  void counter(std::string_view name, std::string_view help, std::vector<Label> labels,
               double value) {
    add(Kind::counter, name, help, std::move(labels), value);
  }
  void gauge(std::string_view name, std::string_view help, std::vector<Label> labels,
             double value) {
    add(Kind::gauge, name, help, std::move(labels), value);
  }

  // Throws proxyep::Error("metrics") when the bounds do not increase or the counts are not
  // cumulative up to `count`.
  void histogram(std::string_view name, std::string_view help, std::vector<Label> labels,
                 Histogram histogram);

  const std::vector<Family>& families() const { return families_; }
  // The samples in Prometheus' text exposition format (version 0.0.4).
  std::string text() const;

 private:
  Sample& add(Kind kind, std::string_view name, std::string_view help, std::vector<Label> labels,
              double value);

  std::vector<Label> common_;
  std::vector<Family> families_;
};

}  // namespace proxyep::metrics
