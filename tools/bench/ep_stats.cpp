#include "tools/bench/ep_stats.hpp"

#include "tools/bench/stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace proxyep::tools {
namespace {

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double gbps(double bytes, double seconds) {
  return seconds > 0 ? bytes / 1e9 / seconds : 0;
}

}  // namespace

std::vector<double> slowest_rank(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> out;
  for (const auto& samples : per_rank) {
    if (out.size() < samples.size()) out.resize(samples.size(), 0.0);
    for (size_t i = 0; i < samples.size(); ++i)
      out[i] = std::max(out[i], samples[i]);
  }
  return out;
}

nlohmann::json phase_json(const std::vector<double>& seconds, const std::vector<double>& bytes,
                          const std::vector<double>& rdma_bytes,
                          const std::vector<double>& messages) {
  std::vector<double> us(seconds.size());
  std::transform(seconds.begin(), seconds.end(), us.begin(), [](double s) { return s * 1e6; });
  double p50 = percentile(us, 50);
  nlohmann::json j = {{"us",
                       {{"p50", p50},
                        {"p95", percentile(us, 95)},
                        {"p99", percentile(us, 99)},
                        {"min", us.empty() ? 0.0 : *std::min_element(us.begin(), us.end())},
                        {"max", us.empty() ? 0.0 : *std::max_element(us.begin(), us.end())}}},
                      {"samples_us", us}};
  if (!bytes.empty()) j["gbps"] = gbps(mean(bytes), p50 * 1e-6);
  if (!rdma_bytes.empty()) j["rdma_gbps"] = gbps(mean(rdma_bytes), p50 * 1e-6);
  if (!messages.empty()) j["msgs_per_s"] = p50 > 0 ? mean(messages) / (p50 * 1e-6) : 0.0;
  return j;
}

std::vector<double> slowest_rank(const RankReports& reports, const char* phase) {
  std::vector<std::vector<double>> per_rank;
  for (const auto& r : reports)
    per_rank.push_back(r.at(phase).get<std::vector<double>>());
  return slowest_rank(per_rank);
}

void add_verdict(nlohmann::json& out, const RankReports& reports) {
  bool verified = true;
  nlohmann::json mismatches = nlohmann::json::array();
  for (size_t r = 0; r < reports.size(); ++r) {
    auto diff = reports[r].at("diff").get<std::string>();
    if (diff.empty()) continue;
    verified = false;
    mismatches.push_back(fmt::format("rank {}: {}", r, diff));
  }
  out["verified"] = verified;
  out["mismatches"] = mismatches;
  // With the reorder shim on (fabric.reorder, internode only): completions it delivered after a
  // later write's, summed over the ranks; the --reorder smoke tests require some.
  if (std::all_of(reports.begin(), reports.end(),
                  [](const nlohmann::json& r) { return r.contains("reordered_completions"); })) {
    uint64_t sum = 0;
    for (const auto& r : reports)
      sum += r.at("reordered_completions").get<uint64_t>();
    out["reorder_shim"] = {{"completions_out_of_order", sum}};
  }
}

}  // namespace proxyep::tools
