#include "proxy/engine/placement.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <algorithm>
#include <map>

namespace proxyep::proxy {
namespace {

constexpr const char* kPhase = "proxy.placement";

// The hwloc NIC a libfabric domain lives on: the device whose name starts the domain's name
// ("rdmap16s27" for "rdmap16s27-rdm", "mlx5_0" for "mlx5_0", "eth0" for tcp's "eth0").
const topology::Device* nic_of(const topology::Topology& topo, const std::string& domain) {
  const topology::Device* best = nullptr;
  for (const auto& nic : topo.nics) {
    if (nic.name.empty() || domain.rfind(nic.name, 0) != 0) continue;
    if (!best || nic.name.size() > best->name.size()) best = &nic;
  }
  return best;
}

int default_threads(size_t domains, const topology::Topology* topo) {
  int cores = topo && !topo->cores.empty() ? static_cast<int>(topo->cores.size()) : 2;
  return std::clamp(static_cast<int>(domains), 1, std::max(1, cores - 1));
}

}  // namespace

std::vector<ThreadPlan> plan_threads(fabric::Fabric& fabric, const PlacementOptions& options,
                                     const topology::Topology* topology) {
  require(options.threads >= 0, kPhase, "proxy.threads must not be negative (got {})",
          options.threads);
  // Rails grouped by domain, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::map<std::string, size_t> index;
  for (int rail = 0; rail < fabric.num_rails(); ++rail) {
    const std::string& domain = fabric.rail(rail).capabilities().domain_name;
    auto [it, inserted] = index.emplace(domain, groups.size());
    if (inserted) groups.push_back({domain, {}});
    groups[it->second].second.push_back(rail);
  }
  int threads = options.threads > 0 ? options.threads : default_threads(groups.size(), topology);
  if (threads > static_cast<int>(groups.size())) {
    log::info(
        "proxy: {} thread(s) requested, but the {} rail(s) share {} domain(s) "
        "(FI_THREAD_DOMAIN: one thread per domain); starting {}",
        threads, fabric.num_rails(), groups.size(), groups.size());
    threads = static_cast<int>(groups.size());
  }
  std::vector<ThreadPlan> plans(static_cast<size_t>(threads));
  for (size_t g = 0; g < groups.size(); ++g) {
    ThreadPlan& plan = plans[g % plans.size()];
    if (plan.domain.empty()) plan.domain = groups[g].first;
    plan.rails.insert(plan.rails.end(), groups[g].second.begin(), groups[g].second.end());
  }
  if (!options.pin) return plans;
  std::vector<int> cpus =
      options.cpus.empty() ? std::vector<int>{} : topology::parse_cpu_list(options.cpus);
  for (size_t t = 0; t < plans.size(); ++t) {
    if (!cpus.empty()) {
      plans[t].pus = {cpus[t % cpus.size()]};
      continue;
    }
    const topology::Device* nic = topology ? nic_of(*topology, plans[t].domain) : nullptr;
    if (nic)
      plans[t].pus = topology::pus_of(topology->cores_near(*nic));
    else if (topology)
      plans[t].pus = topology->pus();
  }
  return plans;
}

}  // namespace proxyep::proxy
