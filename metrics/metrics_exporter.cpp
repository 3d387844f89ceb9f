// MetricsExporter (metrics_exporter.hpp) over prometheus-cpp's Exposer (civetweb).
#include "metrics/metrics_exporter.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "metrics/prometheus_families.hpp"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <fmt/format.h>

namespace proxyep::metrics {

namespace {

constexpr const char* kPhase = "metrics";

}  // namespace

class MetricsExporter::Source final : public prometheus::Collectable {
 public:
  Source(std::vector<Label> labels, MetricsExporter::Collect collect)
      : labels_(std::move(labels)), collect_(std::move(collect)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    MetricsSink sink(labels_);
    try {
      collect_(sink);
    } catch (const std::exception& e) {
      log::warn("metrics: a scrape stopped early: {}", e.what());
    }
    return to_prometheus(sink);
  }

 private:
  std::vector<Label> labels_;
  MetricsExporter::Collect collect_;
};

std::unique_ptr<MetricsExporter> MetricsExporter::start(const std::string& address, int port,
                                                        std::vector<Label> labels,
                                                        Collect collect) {
  require(port >= 0 && port <= 65535, kPhase, "port {} is not a TCP port", port);
  require(address.find(':') == std::string::npos, kPhase,
          "'{}': give an IPv4 address or host name without a port", address);
  std::unique_ptr<MetricsExporter> exporter(new MetricsExporter());
  exporter->address_ = address;
  const std::string where = fmt::format("{}:{}", address, port);
  try {
    // One server thread: scrapes are rare, and every thread is a thread of the rank.
    exporter->exposer_ = std::make_unique<prometheus::Exposer>(where, 1);
  } catch (const std::exception& e) {
    fail(kPhase, "cannot serve metrics on {}: {}", where, e.what());
  }
  const std::vector<int> ports = exporter->exposer_->GetListeningPorts();
  require(!ports.empty(), kPhase, "the metrics server on {} listens on no port", where);
  exporter->port_ = ports.front();
  exporter->source_ = std::make_shared<Source>(std::move(labels), std::move(collect));
  exporter->exposer_->RegisterCollectable(exporter->source_);
  log::info("metrics: serving http://{}:{}/metrics", address, exporter->port_);
  return exporter;
}

MetricsExporter::~MetricsExporter() {
  // The server first: no scrape may run the callback once its owner starts to go.
  exposer_.reset();
}

}  // namespace proxyep::metrics
