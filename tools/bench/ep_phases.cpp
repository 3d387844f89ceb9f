// Per-phase figures of the bench (ep_phases.hpp).
#include "tools/bench/ep_phases.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

namespace proxyep::tools {

namespace {

using Field = uint64_t PhaseTimes::*;

const std::vector<std::pair<const char*, Field>>& fields() {
  static const std::vector<std::pair<const char*, Field>> all = {
      {"prepare", &PhaseTimes::prepare_ns}, {"notify", &PhaseTimes::notify_ns},
      {"pack", &PhaseTimes::pack_ns},       {"post", &PhaseTimes::post_ns},
      {"local", &PhaseTimes::local_ns},     {"unpack", &PhaseTimes::unpack_ns},
      {"wait", &PhaseTimes::wait_ns},       {"reduce", &PhaseTimes::reduce_ns},
      {"quiet", &PhaseTimes::quiet_ns}};
  return all;
}

nlohmann::json per_call(const PhaseTimes& sum) {
  nlohmann::json out = nlohmann::json::object();
  const double calls = sum.calls > 0 ? static_cast<double>(sum.calls) : 1.0;
  for (const auto& [name, field] : fields())
    out[std::string(name) + "_us"] = static_cast<double>(sum.*field) / calls / 1e3;
  out["sum_us"] = static_cast<double>(sum.sum_ns()) / calls / 1e3;
  out["calls"] = sum.calls;
  return out;
}

}  // namespace

const std::vector<const char*>& phase_names() {
  static const std::vector<const char*> names = [] {
    std::vector<const char*> out;
    for (const auto& field : fields())
      out.push_back(field.first);
    return out;
  }();
  return names;
}

void add_phase_delta(PhaseTimes& into, const PhaseTimes& before, const PhaseTimes& after) {
  into.calls += after.calls - before.calls;
  for (const auto& field : fields())
    into.*field.second += after.*field.second - before.*field.second;
}

nlohmann::json phases_json(const EpPhaseTally& tally) {
  return {{"dispatch", per_call(tally.dispatch)},
          {"combine", per_call(tally.combine)},
          {"cached_dispatch", per_call(tally.cached_dispatch)}};
}

nlohmann::json mean_phases(const std::vector<nlohmann::json>& per_rank) {
  nlohmann::json mean;
  int ranks = 0;
  for (const auto& rank : per_rank) {
    if (!rank.is_object()) continue;
    ++ranks;
    for (const auto& [kind, phases] : rank.items())
      for (const auto& [key, value] : phases.items()) {
        nlohmann::json& sum = mean[kind][key];
        sum = (sum.is_null() ? 0.0 : sum.get<double>()) + value.get<double>();
      }
  }
  if (ranks == 0) return nullptr;
  for (auto& [kind, phases] : mean.items())
    for (auto& [key, value] : phases.items())
      value = value.get<double>() / ranks;
  return mean;
}

std::string format_phases(const nlohmann::json& phases) {
  if (!phases.is_object()) return "";
  static const char* kinds[] = {"dispatch", "combine", "cached_dispatch"};
  std::string out = fmt::format("  {:<24}{:>14}{:>14}{:>18}\n", "us per call, rank mean", kinds[0],
                                kinds[1], kinds[2]);
  auto row = [&](const std::string& label, const std::string& key) {
    out += fmt::format("  {:<24}", label);
    for (const char* kind : kinds) {
      const nlohmann::json& k = phases.contains(kind) ? phases[kind] : nlohmann::json();
      const double value = k.is_object() ? k.value(key, 0.0) : 0.0;
      out += fmt::format("{:>{}.1f}", value, kind == kinds[2] ? 18 : 14);
    }
    out += "\n";
  };
  for (const char* name : phase_names())
    row(std::string("  ") + name, std::string(name) + "_us");
  row("  (sum)", "sum_us");
  return out;
}

}  // namespace proxyep::tools
