// MetricsSink: samples grouped by family in first-seen order, the common labels first, the
// text format Prometheus reads, and programming errors (two kinds or helps for one name, bad
// names) refused.
#include "common/error.hpp"
#include "metrics/metrics_sink.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::metrics;

TEST_CASE("samples of one name form one family, in the order first given") {
  MetricsSink sink(std::vector<Label>{{"rank", "3"}});
  sink.counter("proxyep_a_total", "A things", {{"peer", "1"}}, 5);
  sink.gauge("proxyep_b", "B now", {}, 2.5);
  sink.counter("proxyep_a_total", "A things", {{"peer", "2"}}, 7);
  REQUIRE(sink.families().size() == 2);
  const auto& a = sink.families()[0];
  CHECK(a.name == "proxyep_a_total");
  CHECK(a.kind == Kind::counter);
  REQUIRE(a.samples.size() == 2);
  REQUIRE(a.samples[1].labels.size() == 2);
  CHECK(a.samples[1].labels[0].name == "rank");  // the common label first
  CHECK(a.samples[1].labels[1].value == "2");
  CHECK(a.samples[1].value == 7);
  CHECK(sink.families()[1].kind == Kind::gauge);
}

TEST_CASE("the text format has HELP, TYPE and one line per sample") {
  MetricsSink sink(std::vector<Label>{{"rank", "0"}});
  sink.counter("proxyep_a_total", "A things", {{"peer", "1"}}, 5);
  sink.gauge("proxyep_b", "B now", {}, 2.5);
  const std::string text = sink.text();
  CHECK(text.find("# HELP proxyep_a_total A things\n") != std::string::npos);
  CHECK(text.find("# TYPE proxyep_a_total counter\n") != std::string::npos);
  CHECK(text.find("proxyep_a_total{rank=\"0\",peer=\"1\"} 5") != std::string::npos);
  CHECK(text.find("# TYPE proxyep_b gauge\n") != std::string::npos);
  CHECK(text.find("proxyep_b{rank=\"0\"} 2.5") != std::string::npos);
}

TEST_CASE("one name with two kinds or two helps, and invalid names, are refused") {
  MetricsSink sink;
  sink.counter("proxyep_a_total", "A things", {}, 1);
  CHECK_THROWS_AS(sink.gauge("proxyep_a_total", "A things", {}, 1), Error);
  CHECK_THROWS_AS(sink.counter("proxyep_a_total", "other help", {}, 1), Error);
  CHECK_THROWS_AS(sink.counter("0bad name", "x", {}, 1), Error);
  CHECK_THROWS_AS(sink.counter("proxyep_c_total", "x", {{"bad-label", "v"}}, 1), Error);
  CHECK(sink.families().size() == 1);  // nothing half-added
}

TEST_CASE("a histogram is written with cumulative buckets, +Inf, count and sum") {
  MetricsSink sink;
  sink.histogram("proxyep_lat_seconds", "Latency", {{"thread", "0"}},
                 Histogram{{0.001, 0.002}, {3, 5}, 6, 0.0125});
  const std::string text = sink.text();
  CHECK(text.find("# TYPE proxyep_lat_seconds histogram\n") != std::string::npos);
  CHECK(text.find("proxyep_lat_seconds_bucket{thread=\"0\",le=\"0.001\"} 3") != std::string::npos);
  CHECK(text.find("proxyep_lat_seconds_bucket{thread=\"0\",le=\"0.002\"} 5") != std::string::npos);
  CHECK(text.find("proxyep_lat_seconds_bucket{thread=\"0\",le=\"+Inf\"} 6") != std::string::npos);
  CHECK(text.find("proxyep_lat_seconds_count{thread=\"0\"} 6") != std::string::npos);
  CHECK(text.find("proxyep_lat_seconds_sum{thread=\"0\"} 0.0125") != std::string::npos);
  // Bounds that do not increase, counts that shrink or exceed the total: refused.
  CHECK_THROWS_AS(sink.histogram("proxyep_h2", "h", {}, Histogram{{2, 1}, {1, 1}, 1, 0}), Error);
  CHECK_THROWS_AS(sink.histogram("proxyep_h3", "h", {}, Histogram{{1, 2}, {2, 1}, 2, 0}), Error);
  CHECK_THROWS_AS(sink.histogram("proxyep_h4", "h", {}, Histogram{{1}, {3}, 2, 0}), Error);
  CHECK_THROWS_AS(sink.histogram("proxyep_h5", "h", {}, Histogram{{1, 2}, {1}, 2, 0}), Error);
}
