// MetricsExporter: a real HTTP server on loopback, scraped over a real socket; the callback
// runs per scrape; a port in use and a bad address are errors that name them; a throwing
// callback still answers.
#include "common/error.hpp"
#include "metrics/metrics_exporter.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>

using namespace proxyep;
using namespace proxyep::metrics;

namespace {

// GET /metrics from 127.0.0.1:port; the whole response (headers and body).
std::string scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

}  // namespace

TEST_CASE("a scrape runs the callback and serves its samples with the common labels") {
  std::atomic<int> scrapes{0};
  auto exporter = MetricsExporter::start("127.0.0.1", 0, {{"rank", "4"}}, [&](MetricsSink& sink) {
    sink.counter("proxyep_scrapes_seen_total", "Scrapes this test saw", {}, ++scrapes);
  });
  REQUIRE(exporter->port() > 0);
  const std::string first = scrape(exporter->port());
  CHECK(first.find("200 OK") != std::string::npos);
  CHECK(first.find("proxyep_scrapes_seen_total{rank=\"4\"} 1") != std::string::npos);
  const std::string second = scrape(exporter->port());
  CHECK(second.find("proxyep_scrapes_seen_total{rank=\"4\"} 2") != std::string::npos);
}

TEST_CASE("a callback that throws still answers with what it filled") {
  auto exporter = MetricsExporter::start("127.0.0.1", 0, {}, [](MetricsSink& sink) {
    sink.gauge("proxyep_before", "Filled before the throw", {}, 1);
    throw std::runtime_error("source gone");
  });
  const std::string response = scrape(exporter->port());
  CHECK(response.find("200 OK") != std::string::npos);
  CHECK(response.find("proxyep_before 1") != std::string::npos);
}

TEST_CASE("a port in use, a port out of range and an address with a port are errors") {
  auto taken = MetricsExporter::start("127.0.0.1", 0, {}, [](MetricsSink&) {});
  const std::string port = std::to_string(taken->port());
  try {
    (void)MetricsExporter::start("127.0.0.1", taken->port(), {}, [](MetricsSink&) {});
    FAIL("a second server on a port in use started");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + port) != std::string::npos);
  }
  CHECK_THROWS_AS(MetricsExporter::start("127.0.0.1", 70000, {}, [](MetricsSink&) {}), Error);
  CHECK_THROWS_AS(MetricsExporter::start("127.0.0.1:80", 0, {}, [](MetricsSink&) {}), Error);
}
