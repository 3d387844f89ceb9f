#include "tools/bench/ep_compare.hpp"

#include "common/error.hpp"
#include "tools/bench/ep_baseline.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace proxyep::tools {
namespace {

// Every phase either benchmark times, in the order the comparison lists them.
// (memcpy_floor: whether the machine's memory was as fast in both runs; older runs have none.)
constexpr const char* kPhases[] = {"dispatch",      "cached_dispatch", "dispatch_send",
                                   "dispatch_recv", "combine",         "combine_send",
                                   "combine_recv",  "total",           "memcpy_floor"};
constexpr const char* kSides[] = {"proxyep", "normal", "baseline"};
// What must match for the times to measure the same work.
constexpr const char* kShape[] = {"tokens", "hidden", "topk", "experts"};
// What may differ (named in "differences"), as JSON pointers into a run's document.
constexpr const char* kSettings[] = {"/ranks_per_node", "/workload/fp8",   "/workload/routing",
                                     "/workload/seed",  "/workload/iters", "/workload/warmup",
                                     "/hook",           "/provider",       "/reorder",
                                     "/num_nvl_bytes",  "/num_rdma_bytes"};

// The document in `text`: all of it, or, when something else was printed around it (a log line
// on stdout), the lines from the first "{" to the last "}".
nlohmann::json parse_run(const std::string& text) {
  auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) return doc;
  size_t start = text.compare(0, 2, "{\n") == 0 ? 0 : text.find("\n{\n");
  size_t end = text.rfind("\n}");
  if (start == std::string::npos || end == std::string::npos || end < start) return {};
  if (start > 0) ++start;  // past the newline before the "{"
  doc = nlohmann::json::parse(text.substr(start, end + 2 - start), nullptr, false);
  return doc.is_discarded() ? nlohmann::json() : doc;
}

// The baseline variant of a run, or "" without a baseline. Documents from before the variants
// have none: `bench ep` then ran what is now mpi-records, `bench ll` its only baseline, "mpi".
std::string baseline_variant(const nlohmann::json& run) {
  const auto& base = run.value("baseline", nlohmann::json());
  if (!base.is_object()) return "";
  return base.value("variant", run.value("benchmark", "") == "ll" ? kMpiLean : kMpiRecords);
}

std::string text_of(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

nlohmann::json ratio_of(double now, double saved) {
  return saved > 0 ? nlohmann::json(now / saved) : nlohmann::json();
}

bool has_timing(const nlohmann::json& side, const char* phase) {
  return side.is_object() && side.contains(phase) && side[phase].contains("us");
}

}  // namespace

nlohmann::json load_saved_run(const std::string& path, const EpWorkloadCli& workload, int ranks) {
  const std::string benchmark = workload.low_latency ? "ll" : "ep";
  const std::string phase = "bench." + benchmark + ".compare";
  std::ifstream file(path);
  require(file.good(), phase, "--compare {}: cannot read the file", path);
  std::stringstream text;
  text << file.rdbuf();
  auto saved = parse_run(text.str());
  require(saved.is_object() && saved.value("benchmark", "") == benchmark &&
              saved.contains("workload") && saved.contains("ranks") && saved.contains("proxyep"),
          phase, "--compare {}: not the output of `proxyep bench {} --json`", path, benchmark);
  const auto now = to_json(workload);
  std::vector<std::string> differ;
  for (const char* key : kShape)
    if (saved["workload"].value(key, nlohmann::json()) != now[key])
      differ.push_back(fmt::format("{} {} (this run: {})", key,
                                   text_of(saved["workload"].value(key, nlohmann::json())),
                                   text_of(now[key])));
  if (saved["ranks"] != ranks)
    differ.push_back(fmt::format("ranks {} (this run: {})", text_of(saved["ranks"]), ranks));
  if (!differ.empty())
    fail(phase,
         "--compare {}: the saved run has another shape: {}; its times measure other work, so "
         "they are not compared (run with the saved run's --tokens --hidden --topk --experts "
         "--ranks)",
         path, fmt::join(differ, ", "));
  return saved;
}

nlohmann::json compare_runs(const nlohmann::json& now, const nlohmann::json& saved,
                            const std::string& path) {
  nlohmann::json out = {{"file", path},
                        {"benchmark", now.value("benchmark", "")},
                        {"differences", nlohmann::json::array()},
                        {"notes", nlohmann::json::array()},
                        {"paths", nlohmann::json::object()}};
  for (const char* pointer : kSettings) {
    nlohmann::json::json_pointer at(pointer);
    auto a = saved.contains(at) ? saved[at] : nlohmann::json();
    auto b = now.contains(at) ? now[at] : nlohmann::json();
    if (a != b)
      out["differences"].push_back(fmt::format(
          "{}: saved {}, now {}", std::string(pointer).substr(1), text_of(a), text_of(b)));
  }
  const std::string saved_variant = baseline_variant(saved), now_variant = baseline_variant(now);
  if (saved_variant != now_variant)
    out["notes"].push_back(
        fmt::format("baseline not compared: the saved run's was {}, this run's {}",
                    saved_variant.empty() ? "none" : saved_variant,
                    now_variant.empty() ? "none" : now_variant));
  for (const char* side : kSides) {
    if (side == std::string("baseline") && saved_variant != now_variant) continue;
    const auto& a = saved.value(side, nlohmann::json());
    const auto& b = now.value(side, nlohmann::json());
    for (const char* phase : kPhases) {
      if (!has_timing(a, phase) || !has_timing(b, phase)) continue;
      for (const char* stat : {"p50", "p99"}) {
        double s = a[phase]["us"].value(stat, 0.0), n = b[phase]["us"].value(stat, 0.0);
        out["paths"][side][phase][stat] = {{"now", n}, {"saved", s}, {"ratio", ratio_of(n, s)}};
      }
    }
  }
  if (now.contains("baseline") && now["baseline"].is_object())
    out["baseline_variant"] = now_variant;
  return out;
}

void print_comparison(const nlohmann::json& c) {
  fmt::print("compare with {} (ratio = now / saved; below 1 is faster now):\n",
             c.at("file").get<std::string>());
  fmt::print("  {:<30}{:>11}{:>11}{:>8}{:>11}{:>11}{:>8}\n", "", "p50 us", "saved", "ratio",
             "p99 us", "saved", "ratio");
  auto ratio_text = [](const nlohmann::json& r) {
    return r.is_number() ? fmt::format("{:.2f}x", r.get<double>()) : std::string("-");
  };
  for (const char* side : kSides) {
    if (!c.at("paths").contains(side)) continue;
    const auto& phases = c["paths"][side];
    // Rows named as the benchmark's own table names them.
    std::string name = side;
    if (name == "baseline") name = c.value("baseline_variant", name);
    if (name == "proxyep" && c.value("benchmark", "") == "ll") name = "ll";
    for (const char* phase : kPhases) {
      if (!phases.contains(phase)) continue;
      const auto& p50 = phases[phase]["p50"];
      const auto& p99 = phases[phase]["p99"];
      fmt::print("  {:<30}{:>11.1f}{:>11.1f}{:>8}{:>11.1f}{:>11.1f}{:>8}\n",
                 fmt::format("{} {}", name, phase), p50["now"].get<double>(),
                 p50["saved"].get<double>(), ratio_text(p50["ratio"]), p99["now"].get<double>(),
                 p99["saved"].get<double>(), ratio_text(p99["ratio"]));
    }
  }
  for (const auto& d : c.at("differences"))
    fmt::print("  differs from the saved run: {}\n", d.get<std::string>());
  for (const auto& n : c.at("notes"))
    fmt::print("  note: {}\n", n.get<std::string>());
}

}  // namespace proxyep::tools
