// MetricsExporter: serves Prometheus text exposition at http://<address>:<port>/metrics from a
// callback that fills a MetricsSink on each scrape (on the HTTP server's thread: the callback
// must only read what is safe to read from another thread).
//
//   auto exporter = MetricsExporter::start("127.0.0.1", 9464, [&](MetricsSink& sink) {
//     sink.counter("proxyep_calls_total", "Calls completed", {}, calls.load());
//   });
//   exporter->port();  // the port it listens on (the one chosen when asked for port 0)
//
// The server stops when the exporter is destroyed; a scrape in progress finishes first. An
// exception from the callback is logged and the scrape answers with what was filled before it.
#pragma once

#include "metrics/metrics_sink.hpp"

#include <functional>
#include <memory>
#include <string>

namespace prometheus {
class Exposer;
}

namespace proxyep::metrics {

class MetricsExporter {
 public:
  using Collect = std::function<void(MetricsSink&)>;

  // Listens on `address`:`port` (0: any free port). `labels` go on every sample. Throws
  // proxyep::Error("metrics") when the address cannot be bound (naming it).
  static std::unique_ptr<MetricsExporter> start(const std::string& address, int port,
                                                std::vector<Label> labels, Collect collect);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const { return port_; }
  const std::string& address() const { return address_; }

 private:
  class Source;
  MetricsExporter() = default;

  std::string address_;
  int port_ = 0;
  std::shared_ptr<Source> source_;  // registered with the exposer (which holds a weak_ptr)
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace proxyep::metrics
