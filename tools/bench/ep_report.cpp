#include "tools/bench/ep_report.hpp"
#include "tools/bench/fabric_bytes.hpp"
#include "tools/bench/setup_report.hpp"

#include "tools/bench/ep_floor.hpp"

#include <fmt/format.h>

#include <string>

namespace proxyep::tools {
namespace {

double p50_of(const nlohmann::json& side, const char* phase) {
  return side.at(phase).at("us").at("p50").get<double>();
}

void print_row(const std::string& label, const nlohmann::json& phase, bool rdma) {
  const auto& us = phase.at("us");
  std::string rdma_text = rdma && phase.contains("rdma_gbps")
                              ? fmt::format("{:10.2f}", phase["rdma_gbps"].get<double>())
                              : "";
  fmt::print("  {:<26}{:>10.1f}{:>10.1f}{:>10.1f}{:>10.2f}{}\n", label, us["p50"].get<double>(),
             us["p95"].get<double>(), us["p99"].get<double>(), phase["gbps"].get<double>(),
             rdma_text);
}

const char* yes_no(bool value) {
  return value ? "yes" : "NO";
}

}  // namespace

void attach_baseline(nlohmann::json& results, nlohmann::json baseline,
                     nlohmann::json upper_bracket) {
  bool verified = results.at("proxyep").at("verified").get<bool>();
  if (results.contains("per_rank")) {  // bench ep --internode both
    const auto& per_rank = results["per_rank"];
    verified = verified && per_rank.at("verified").get<bool>();
    const double ours = p50_of(results["proxyep"], "total");
    results["speedup_vs_per_rank"] = ours > 0 ? p50_of(per_rank, "total") / ours : 0.0;
  }
  if (results.contains("normal")) {  // bench ll: normal mode on the same tokens
    const auto& normal = results["normal"];
    verified = verified && normal.at("verified").get<bool>();
    double ours = p50_of(results["proxyep"], "total");
    results["speedup_vs_normal"] = ours > 0 ? p50_of(normal, "total") / ours : 0.0;
  }
  if (baseline.is_null()) {
    results["baseline"] = nullptr;
    results["speedup_vs_baseline"] = nullptr;
  } else {
    verified = verified && baseline.at("verified").get<bool>();
    double ours = p50_of(results["proxyep"], "total");
    double theirs = p50_of(baseline, "total");
    results["speedup_vs_baseline"] = ours > 0 ? theirs / ours : 0.0;
    results["baseline"] = std::move(baseline);
  }
  if (!upper_bracket.is_null()) {
    verified = verified && upper_bracket.at("verified").get<bool>();
    double ours = p50_of(results["proxyep"], "total");
    results["speedup_vs_baseline_upper_bracket"] =
        ours > 0 ? p50_of(upper_bracket, "total") / ours : 0.0;
    results["baseline_upper_bracket"] = std::move(upper_bracket);
  }
  results["verified"] = verified;
}

void print_baseline_brackets(const nlohmann::json& r) {
  if (!r.contains("baseline_upper_bracket")) return;
  const auto& lower = r["baseline"];
  const auto& upper = r["baseline_upper_bracket"];
  const double ours = p50_of(r["proxyep"], "total");
  fmt::print(
      "  MPI brackets (no testbed: ProxyEP's nodes share memory inside and a fabric provider "
      "between; Open MPI on one host sees one node, so it runs both ways):\n");
  fmt::print("    tcp everywhere:           {:10.1f} us -> proxyep {:.2f}x (flatters proxyep)\n",
             p50_of(lower, "total"), r["speedup_vs_baseline"].get<double>());
  fmt::print("    shared memory everywhere: {:10.1f} us -> proxyep {:.2f}x (flatters MPI)\n",
             p50_of(upper, "total"), r["speedup_vs_baseline_upper_bracket"].get<double>());
  fmt::print(
      "    proxyep {:.1f} us; a cluster's MPI lies between the two (--link: the same links "
      "for both)\n",
      ours);
  if (upper.contains("mismatch"))
    fmt::print("  mpi (shared memory everywhere) mismatch: {}\n",
               upper["mismatch"].get<std::string>());
}

void print_ep_report(const nlohmann::json& r) {
  const auto& w = r.at("workload");
  const auto& traffic = r.at("traffic");
  int nodes = r.at("nodes").get<int>();
  bool rdma = nodes > 1;
  fmt::print(
      "bench ep: {} ranks, {} per node ({} node{}), {} tokens x {} hidden, top-{} of {} "
      "experts, {} routing, {}\n",
      r["ranks"].get<int>(), r["ranks_per_node"].get<int>(), nodes, nodes > 1 ? "s" : "",
      w["tokens"].get<int>(), w["hidden"].get<int>(), w["topk"].get<int>(), w["experts"].get<int>(),
      w["routing"].get<std::string>(), w["fp8"].get<bool>() ? "FP8 dispatch" : "BF16");
  if (r.contains("num_nvl_bytes"))
    fmt::print("  Buffer: num_nvl_bytes {}, num_rdma_bytes {}; tensors: {}\n",
               r["num_nvl_bytes"].get<int64_t>(), r["num_rdma_bytes"].get<int64_t>(),
               r.value("device", "host"));
  if (nodes > 1 && r.contains("provider"))
    fmt::print("  internode provider: {}{}; ep.internode {}\n", r["provider"].get<std::string>(),
               r.value("reorder", false) ? " (reorder shim)" : "",
               r.value("internode", std::string("per_rank")));
  fmt::print(
      "  expert load imbalance (max/mean tokens per expert): {:.3f}; received tokens per "
      "rank max/mean: {:.3f}\n",
      traffic["expert_imbalance"].get<double>(), traffic["rank_imbalance"].get<double>());
  fmt::print(
      "  {} timed iterations after {} warm-up; slowest rank per iteration; GB/s = DeepEP "
      "bytes / p50\n",
      w["iters"].get<int>(), w["warmup"].get<int>());
  fmt::print("  {:<26}{:>10}{:>10}{:>10}{:>10}{}\n", "", "p50 us", "p95 us", "p99 us", "GB/s",
             rdma ? "  RDMA GB/s" : "");
  const auto& ours = r.at("proxyep");
  print_row("proxyep dispatch", ours["dispatch"], rdma);
  print_row("proxyep dispatch (cached)", ours["cached_dispatch"], rdma);
  print_row("proxyep combine", ours["combine"], rdma);
  // The same-run memory floor (ep_floor.hpp): absent with --no-floor.
  if (ours.contains("memcpy_floor")) print_row("memcpy floor", ours["memcpy_floor"], rdma);
  if (ours.contains("fabric")) fmt::print("{}", format_fabric_bytes(ours["fabric"]));
  fmt::print("{}", format_setup(ours.value("setup", nlohmann::json())));
  if (r.contains("per_rank")) {  // --internode both: the same calls sent per rank
    const auto& per = r["per_rank"];
    print_row("per_rank dispatch", per["dispatch"], rdma);
    print_row("per_rank combine", per["combine"], rdma);
    if (per.contains("fabric")) fmt::print("{}", format_fabric_bytes(per["fabric"], "per_rank: "));
    fmt::print("  dispatch+combine p50: hierarchical {:.1f} us, per_rank {:.1f} us -> {:.2f}x\n",
               p50_of(ours, "total"), p50_of(per, "total"), r["speedup_vs_per_rank"].get<double>());
  }
  const std::string floor_line = memory_floor_line(ours);
  const auto& base = r["baseline"];
  // The variant's name labels its rows: "mpi" (lean) or "mpi-records" (ep_baseline.hpp).
  const std::string name = base.is_null() ? "" : base.value("variant", std::string("mpi"));
  if (!base.is_null()) {
    print_row(name + " dispatch", base["dispatch"], rdma);
    print_row(name + " combine", base["combine"], rdma);
    fmt::print("  dispatch+combine p50: proxyep {:.1f} us, {} {:.1f} us -> speedup {:.2f}x\n",
               p50_of(ours, "total"), name, p50_of(base, "total"),
               r["speedup_vs_baseline"].get<double>());
    fmt::print("{}", floor_line);
    fmt::print("  {}: {}; {}; {} ({})\n", name, base.value("implementation", std::string("?")),
               base.value("transport", std::string("?")),
               base.value("mpi_library", std::string("?")), base.value("command", std::string("")));
    print_baseline_brackets(r);
  } else {
    fmt::print("{}", floor_line);
  }
  fmt::print(
      "verified: {} (proxyep {}{}{}{})\n", yes_no(r["verified"].get<bool>()),
      yes_no(ours["verified"].get<bool>()),
      r.contains("per_rank")
          ? fmt::format(", per_rank {}", yes_no(r["per_rank"]["verified"].get<bool>()))
          : "",
      base.is_null() ? "" : fmt::format(", {} {}", name, yes_no(base["verified"].get<bool>())),
      r.contains("baseline_upper_bracket")
          ? fmt::format(", {} (shared memory everywhere) {}", name,
                        yes_no(r["baseline_upper_bracket"]["verified"].get<bool>()))
          : "");
  for (const auto& m : ours["mismatches"])
    fmt::print("  proxyep mismatch: {}\n", m.get<std::string>());
  if (!base.is_null() && base.contains("mismatch"))
    fmt::print("  {} mismatch: {}\n", name, base["mismatch"].get<std::string>());
}

}  // namespace proxyep::tools
