#include "tools/bench/setup_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace proxyep::tools {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

nlohmann::json step_json(const std::string& step, const std::vector<double>& seconds,
                         const std::vector<double>& cpu_seconds) {
  return {{"step", step},
          {"p50_ms", median(seconds) * 1e3},
          {"max_ms", *std::max_element(seconds.begin(), seconds.end()) * 1e3},
          {"cpu_p50_ms", median(cpu_seconds) * 1e3}};
}

}  // namespace

nlohmann::json setup_steps_json(const StepClock::Steps& steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& step : steps)
    out.push_back({{"step", step.name}, {"s", step.seconds}, {"cpu_s", step.cpu_seconds}});
  return out;
}

nlohmann::json setup_summary(const RankReports& reports) {
  if (reports.empty() || !reports.front().contains("setup")) return nullptr;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& first : reports.front()["setup"]) {
    const auto step = first["step"].get<std::string>();
    std::vector<double> seconds, cpu;
    for (const auto& report : reports)
      for (const auto& entry : report.value("setup", nlohmann::json::array()))
        if (entry["step"] == step) {
          seconds.push_back(entry["s"].get<double>());
          cpu.push_back(entry["cpu_s"].get<double>());
        }
    out.push_back(step_json(step, seconds, cpu));
  }
  std::vector<double> totals, cpu_totals;
  for (const auto& report : reports) {
    double total = 0, cpu = 0;
    for (const auto& entry : report.value("setup", nlohmann::json::array())) {
      total += entry["s"].get<double>();
      cpu += entry["cpu_s"].get<double>();
    }
    totals.push_back(total);
    cpu_totals.push_back(cpu);
  }
  out.push_back(step_json("total", totals, cpu_totals));
  return out;
}

std::string format_setup(const nlohmann::json& summary, std::string_view label) {
  if (!summary.is_array() || summary.empty()) return "";
  const auto& total = summary.back();
  std::vector<nlohmann::json> steps(summary.begin(), summary.end() - 1);
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) {
    return a["max_ms"].template get<double>() > b["max_ms"].template get<double>();
  });
  std::string slowest;
  for (size_t i = 0; i < steps.size() && i < 3; ++i)
    slowest += fmt::format("{}{} {:.0f} ms", i ? ", " : "", steps[i]["step"].get<std::string>(),
                           steps[i]["max_ms"].get<double>());
  return fmt::format(
      "  {}Buffer setup: p50 {:.0f} ms (CPU {:.0f} ms), slowest rank {:.0f} ms; slowest steps: "
      "{}\n",
      label, total["p50_ms"].get<double>(), total["cpu_p50_ms"].get<double>(),
      total["max_ms"].get<double>(), slowest);
}

}  // namespace proxyep::tools
