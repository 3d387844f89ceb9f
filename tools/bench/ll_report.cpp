// The table of `proxyep bench ll` (ll_bench.hpp): the low-latency figures, normal mode's and the
// MPI baseline's on the same tokens, and their p50 over the low-latency one's, phase by phase.
#include "tools/bench/ep_report.hpp"
#include "tools/bench/fabric_bytes.hpp"
#include "tools/bench/ll_bench.hpp"
#include "tools/bench/setup_report.hpp"

#include <fmt/format.h>

#include <string>

namespace proxyep::tools {
namespace {

double p50(const nlohmann::json& phase) {
  return phase.at("us").at("p50").get<double>();
}

std::string optional_figure(const nlohmann::json& phase, const char* key, double scale) {
  return phase.contains(key) ? fmt::format("{:.2f}", phase[key].get<double>() * scale) : "-";
}

// One row; `ll_phase` (the low-latency phase it compares with) gives the last column.
void print_row(const std::string& label, const nlohmann::json& phase,
               const nlohmann::json* ll_phase = nullptr) {
  const auto& us = phase.at("us");
  std::string ratio =
      ll_phase && p50(*ll_phase) > 0 ? fmt::format("{:.2f}x", p50(phase) / p50(*ll_phase)) : "";
  fmt::print("  {:<30}{:>9.1f}{:>9.1f}{:>9.1f}{:>8}{:>8}{:>8}{:>10}\n", label, p50(phase),
             us.at("p95").get<double>(), us.at("p99").get<double>(),
             optional_figure(phase, "gbps", 1.0), optional_figure(phase, "rdma_gbps", 1.0),
             optional_figure(phase, "msgs_per_s", 1e-6), ratio);
}

// dispatch, combine and dispatch+combine of a side that is compared with the low-latency one.
void print_side(const char* name, const nlohmann::json& side, const nlohmann::json& ll) {
  print_row(fmt::format("{} dispatch", name), side.at("dispatch"), &ll.at("dispatch"));
  print_row(fmt::format("{} combine", name), side.at("combine"), &ll.at("combine"));
  print_row(fmt::format("{} dispatch+combine", name), side.at("total"), &ll.at("total"));
}

const char* yes_no(bool value) {
  return value ? "yes" : "NO";
}

}  // namespace

void print_ll_report(const nlohmann::json& r) {
  const auto& w = r.at("workload");
  const int nodes = r.at("nodes").get<int>();
  const bool hook = r.at("hook").get<bool>();
  fmt::print(
      "bench ll: {} ranks, {} per node ({} node{}), {} tokens x {} hidden, top-{} of {} "
      "experts (DeepEP's test_low_latency data), {} dispatch{}\n",
      r["ranks"].get<int>(), r["ranks_per_node"].get<int>(), nodes, nodes > 1 ? "s" : "",
      w["tokens"].get<int>(), w["hidden"].get<int>(), w["topk"].get<int>(), w["experts"].get<int>(),
      w["fp8"].get<bool>() ? "FP8" : "BF16", hook ? ", return_recv_hook" : "");
  const auto& ll = r.at("proxyep");
  const auto& normal = r.at("normal");
  fmt::print(
      "  low-latency Buffer: num_rdma_bytes {}; normal-mode Buffer: num_nvl_bytes {}, "
      "num_rdma_bytes {}\n",
      r["num_rdma_bytes"].get<int64_t>(), normal["num_nvl_bytes"].get<int64_t>(),
      normal["num_rdma_bytes"].get<int64_t>());
  if (nodes > 1 && r.contains("provider"))
    fmt::print("  internode provider: {}{}\n", r["provider"].get<std::string>(),
               r.value("reorder", false) ? " (reorder shim)" : "");
  fmt::print(
      "  {} timed iterations after {} warm-up; slowest rank per iteration; GB/s = DeepEP LL "
      "bytes / p50 (normal rows: DeepEP's normal-mode bytes); Mmsg/s = selections to other "
      "nodes per rank / p50; last column: p50 over the low-latency p50\n",
      w["iters"].get<int>(), w["warmup"].get<int>());
  fmt::print("  {:<30}{:>9}{:>9}{:>9}{:>8}{:>8}{:>8}{:>10}\n", "", "p50 us", "p95 us", "p99 us",
             "GB/s", "RDMA", "Mmsg/s", "vs LL");
  print_row("ll dispatch", ll["dispatch"]);
  if (hook) {
    print_row("ll   send (call)", ll["dispatch_send"]);
    print_row("ll   receive (hook)", ll["dispatch_recv"]);
  }
  print_row("ll combine", ll["combine"]);
  if (hook) {
    print_row("ll   send (call)", ll["combine_send"]);
    print_row("ll   receive (hook)", ll["combine_recv"]);
  }
  print_row("ll dispatch+combine", ll["total"]);
  if (ll.contains("fabric")) fmt::print("{}", format_fabric_bytes(ll["fabric"], "ll "));
  fmt::print("{}", format_setup(ll.value("setup", nlohmann::json()), "ll "));
  print_side("normal", normal, ll);
  if (normal.contains("fabric")) fmt::print("{}", format_fabric_bytes(normal["fabric"], "normal "));
  const auto& base = r["baseline"];
  if (!base.is_null()) {
    print_side("mpi", base, ll);
    fmt::print("  mpi: {}; {} ({})\n", base.value("transport", std::string("?")),
               base.value("mpi_library", std::string("?")), base.value("command", std::string("")));
    print_baseline_brackets(r);
  }
  fmt::print("  combine calc_diff (max over ranks): {:.3g}\n",
             ll["combine_calc_diff_max"].get<double>());
  fmt::print("verified: {} (low-latency {}, normal {}{}{})\n", yes_no(r["verified"].get<bool>()),
             yes_no(ll["verified"].get<bool>()), yes_no(normal["verified"].get<bool>()),
             base.is_null() ? "" : fmt::format(", mpi {}", yes_no(base["verified"].get<bool>())),
             r.contains("baseline_upper_bracket")
                 ? fmt::format(", mpi (shared memory everywhere) {}",
                               yes_no(r["baseline_upper_bracket"]["verified"].get<bool>()))
                 : "");
  for (const char* side : {"proxyep", "normal"})
    for (const auto& m : r[side]["mismatches"])
      fmt::print("  {} mismatch: {}\n", side == std::string("proxyep") ? "low-latency" : "normal",
                 m.get<std::string>());
  if (!base.is_null() && base.contains("mismatch"))
    fmt::print("  mpi mismatch: {}\n", base["mismatch"].get<std::string>());
}

}  // namespace proxyep::tools
