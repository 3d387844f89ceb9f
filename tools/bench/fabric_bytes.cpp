#include "tools/bench/fabric_bytes.hpp"

#include "common/params.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace proxyep::tools {
namespace {

nlohmann::json phase(const RankReports& reports, const char* name, int ranks_per_node,
                     const std::vector<double>& convention, double p50_us, double link_gbps) {
  std::vector<uint64_t> measured;
  for (const auto& report : reports)
    measured.push_back(report.at("fabric_bytes").value(name, uint64_t{0}));
  const double total = std::accumulate(measured.begin(), measured.end(), 0.0);
  const double expected = std::accumulate(convention.begin(), convention.end(), 0.0);
  nlohmann::json out = {{"measured_bytes_per_rank", measured},
                        {"measured_bytes", total},
                        {"convention_bytes", expected},
                        {"measured_over_convention", expected > 0 ? total / expected : 0.0}};
  if (link_gbps > 0 && p50_us > 0) {
    double busiest = 0;  // bytes the busiest node sent in one call
    for (size_t first = 0; first < measured.size(); first += ranks_per_node) {
      double node = 0;
      for (size_t r = first; r < std::min(measured.size(), first + ranks_per_node); ++r)
        node += static_cast<double>(measured[r]);
      busiest = std::max(busiest, node);
    }
    out["link_utilisation"] = busiest * 8 / (p50_us * 1e-6) / (link_gbps * 1e9);
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const CallFabricBytes& bytes) {
  return {{"dispatch", bytes.dispatch}, {"combine", bytes.combine}};
}

nlohmann::json fabric_bytes_json(const RankReports& reports, int ranks_per_node,
                                 const std::string& convention,
                                 const std::vector<double>& convention_dispatch,
                                 const std::vector<double>& convention_combine,
                                 double dispatch_p50_us, double combine_p50_us) {
  const double link = params::testbed_link_gbps.get();
  nlohmann::json out = {{"dispatch", phase(reports, "dispatch", ranks_per_node, convention_dispatch,
                                           dispatch_p50_us, link)},
                        {"combine", phase(reports, "combine", ranks_per_node, convention_combine,
                                          combine_p50_us, link)}};
  out["convention"] = convention;
  if (link > 0) out["link_gbps"] = link;
  return out;
}

std::string format_fabric_bytes(const nlohmann::json& fabric, std::string_view label) {
  if (fabric.is_null()) return "";
  std::string text;
  for (const char* name : {"dispatch", "combine"}) {
    const auto& p = fabric.at(name);
    double measured = p.at("measured_bytes").get<double>();
    if (measured == 0 && p.at("convention_bytes").get<double>() == 0) continue;
    text += fmt::format("  {}fabric bytes per {}: {:.3f} MB measured, {:.2f}x the {:.3f} MB of {}",
                        label, name, measured / 1e6, p.at("measured_over_convention").get<double>(),
                        p.at("convention_bytes").get<double>() / 1e6,
                        fabric.at("convention").get<std::string>());
    if (p.contains("link_utilisation"))
      text += fmt::format("; busiest link {:.0f}% used at p50 ({:.3g} Gbit/s links)",
                          100 * p.at("link_utilisation").get<double>(),
                          fabric.at("link_gbps").get<double>());
    text += "\n";
  }
  return text;
}

}  // namespace proxyep::tools
