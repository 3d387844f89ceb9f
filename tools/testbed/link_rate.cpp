#include "tools/testbed/link_rate.hpp"

#include "common/params.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace proxyep::tools::testbed {
namespace {

constexpr size_t kCopyBytes = size_t{64} << 20;  // larger than any last-level cache here
constexpr int kCopies = 7;

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

double measure_copy_gbytes() {
  auto from = std::make_unique<char[]>(kCopyBytes);
  auto to = std::make_unique<char[]>(kCopyBytes);
  // Touch both first: the copies time memory, not page faults.
  std::memset(from.get(), 1, kCopyBytes);
  std::memset(to.get(), 0, kCopyBytes);
  std::vector<double> rates;
  for (int i = 0; i < kCopies; ++i) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(to.get(), from.get(), kCopyBytes);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    rates.push_back(static_cast<double>(kCopyBytes) / took.count() / 1e9);
    from[i] = to[kCopyBytes - 1 - i];  // keeps the copies from being optimised away
  }
  // The fastest copy: what the core can do; slower ones measure whatever else ran meanwhile.
  return *std::max_element(rates.begin(), rates.end());
}

ResolvedLink resolve_link(const LinkSpec& spec, int ranks, int ranks_per_node) {
  ResolvedLink link;
  link.latency_us = spec.latency_us;
  if (spec.preset == nullptr) {
    link.gbps = spec.gbps;
    link.how = fmt::format("{:.3g} Gbit/s per node as given", spec.gbps);
    return link;
  }
  const auto& preset = *spec.preset;
  double copy = params::launch_link_copy_gbytes.get();
  const bool measured = copy <= 0;
  if (measured) copy = measure_copy_gbytes();
  const int cores = usable_cores();
  const double share = std::min(1.0, static_cast<double>(cores) / ranks);
  const double per_rank_gbps = copy * share * 8 / preset.ratio();
  link.gbps = std::clamp(per_rank_gbps * ranks_per_node, kMinLinkGbps, kMaxLinkGbps);
  link.how = fmt::format(
      "preset {}: {} ranks per node x {:.3g} GB/s one core copies ({}) x {:.2g} ({} cores for "
      "{} ranks) x 8 / {:.3g} (NVLink:EFA per GPU) = {:.3g} Gbit/s per node",
      preset.name, ranks_per_node, copy, measured ? "measured" : "launch.link_copy_gbytes", share,
      cores, ranks, preset.ratio(), link.gbps);
  return link;
}

}  // namespace proxyep::tools::testbed
