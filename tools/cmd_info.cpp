// `proxyep info`: what this host offers ProxyEP: the libfabric providers that can serve it (with
// the capabilities behaviour is chosen from) and the hwloc topology proxy threads are placed on.
// `--json` prints one document {"providers": [...], "topology": {...}} and nothing else on stdout.
#include "common/error.hpp"
#include "common/topology.hpp"
#include "fabric/capabilities.hpp"
#include "tools/commands.hpp"
#include "tools/info_memory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rdma/fabric.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace proxyep::tools {
namespace {

struct InfoOptions {
  bool json = false;
  std::string provider;
  MemoryCli memory;
};

// "8 B", "16 KiB", "1.5 MiB": exact when the value is a whole number of the unit.
std::string format_bytes(uint64_t bytes) {
  // Providers say "no limit" with SIZE_MAX or values just under it.
  if (bytes >= (uint64_t{1} << 60)) return "unlimited";
  constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t unit = 0;
  while (unit + 1 < kUnits.size() && bytes >= (uint64_t{1} << (10 * (unit + 1))))
    ++unit;
  const uint64_t scale = uint64_t{1} << (10 * unit);
  if (bytes % scale == 0) return fmt::format("{} {}", bytes / scale, kUnits[unit]);
  return fmt::format("{:.1f} {}", static_cast<double>(bytes) / static_cast<double>(scale),
                     kUnits[unit]);
}

// FI_MR_* bits by name; bits 0 and 1 are the pre-1.5 FI_MR_BASIC/FI_MR_SCALABLE modes.
std::string mr_mode_names(uint64_t mr_mode) {
  static constexpr std::array<std::pair<uint64_t, const char*>, 12> kNames = {{
      {1u << 0, "basic"},
      {1u << 1, "scalable"},
      {FI_MR_LOCAL, "local"},
      {FI_MR_RAW, "raw"},
      {FI_MR_VIRT_ADDR, "virt_addr"},
      {FI_MR_ALLOCATED, "allocated"},
      {FI_MR_PROV_KEY, "prov_key"},
      {FI_MR_MMU_NOTIFY, "mmu_notify"},
      {FI_MR_RMA_EVENT, "rma_event"},
      {FI_MR_ENDPOINT, "endpoint"},
      {FI_MR_HMEM, "hmem"},
      {FI_MR_COLLECTIVE, "collective"},
  }};
  std::string names;
  for (const auto& [bit, name] : kNames) {
    if ((mr_mode & bit) == 0) continue;
    names += names.empty() ? name : fmt::format(",{}", name);
    mr_mode &= ~bit;
  }
  if (mr_mode != 0) names += fmt::format("{}0x{:x}", names.empty() ? "" : ",", mr_mode);
  return names.empty() ? "none" : names;
}

const char* yes_no(bool value) {
  return value ? "yes" : "no";
}

// Equal in every field this view prints, so printed once with every place that offers it (the
// full caps/mode/msg_order bits, which can differ between lo and a NIC, are in --json).
bool same_capabilities(const fabric::Capabilities& a, const fabric::Capabilities& b) {
  auto key = [](const fabric::Capabilities& c) {
    return std::tie(c.provider, c.api_version, c.rma_write_ordered, c.cq_data_size, c.inject_size,
                    c.max_msg_size, c.rma_iov_limit, c.tx_size, c.rx_size, c.mr_mode, c.hmem,
                    c.manual_progress);
  };
  return key(a) == key(b);
}

// One provider configuration and the domains (each with its fabrics) that offer it. tcp lists
// one fi_info per interface address, so a plain listing repeats identical blocks many times.
struct ProviderGroup {
  const fabric::Capabilities* caps = nullptr;
  std::vector<std::pair<std::string, std::vector<std::string>>> domains;

  void add(const fabric::Capabilities& entry) {
    for (auto& [domain, fabrics] : domains) {
      if (domain == entry.domain_name) {
        fabrics.push_back(entry.fabric_name);
        return;
      }
    }
    domains.push_back({entry.domain_name, {entry.fabric_name}});
  }
};

std::vector<ProviderGroup> group_providers(const std::vector<fabric::Capabilities>& providers) {
  std::vector<ProviderGroup> groups;
  for (const auto& entry : providers) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const ProviderGroup& group) {
      return same_capabilities(*group.caps, entry);
    });
    if (it == groups.end()) it = groups.insert(groups.end(), ProviderGroup{&entry, {}});
    it->add(entry);
  }
  return groups;
}

void print_provider_group(const ProviderGroup& group) {
  const fabric::Capabilities& caps = *group.caps;
  std::string places;
  for (const auto& [domain, fabrics] : group.domains) {
    // The fabric is the domain's own name on shm-like providers; say it only when it adds.
    const bool same_name = fabrics.size() == 1 && fabrics.front() == domain;
    places += fmt::format("{}{}{}", places.empty() ? "" : ", ", domain,
                          same_name ? "" : fmt::format(" [{}]", fmt::join(fabrics, ", ")));
  }
  // FI_VERSION packs major in the high 16 bits and minor in the low 16.
  fmt::print("  {} (api {}.{}) on {}\n", caps.provider, caps.api_version >> 16,
             caps.api_version & 0xffff, places);
  fmt::print(
      "    cq_data {}  inject {}  max_msg {}  rma_iov {}  tx/rx {}/{}  write order (WAW) {}\n",
      format_bytes(caps.cq_data_size), format_bytes(caps.inject_size),
      format_bytes(caps.max_msg_size), caps.rma_iov_limit, caps.tx_size, caps.rx_size,
      yes_no(caps.rma_write_ordered));
  fmt::print("    mr_mode {}  hmem {}  progress {}\n", mr_mode_names(caps.mr_mode),
             yes_no(caps.hmem), caps.manual_progress ? "manual" : "auto");
}

void print_providers(const std::vector<fabric::Capabilities>& providers,
                     const std::string& filter) {
  if (providers.empty()) {
    fmt::print("Providers: {}\n",
               filter.empty() ? "none found" : fmt::format("none match '{}'", filter));
    return;
  }
  const auto groups = group_providers(providers);
  fmt::print("Providers ({} entries{}; domain [fabrics]):\n", providers.size(),
             filter.empty() ? "" : fmt::format(" matching '{}'", filter));
  for (const auto& group : groups)
    print_provider_group(group);
}

std::string plural(size_t count, const char* noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

void print_device(const topology::Topology& topo, const topology::Device& device) {
  std::string where = "locality unknown";
  if (device.locality_known()) {
    where = fmt::format("NUMA {}, near PUs {} ({})", topology::format_cpu_list(device.numa_nodes),
                        topology::format_cpu_list(device.near_pus),
                        plural(topo.cores_near(device).size(), "core"));
  }
  fmt::print("  {} {} ({}){}{}: {}\n", device.kind == topology::DeviceKind::gpu ? "GPU" : "NIC",
             device.name, topology::to_string(device.kind),
             device.model.empty() ? "" : " " + device.model,
             device.pci_bus_id.empty() ? "" : " pci " + device.pci_bus_id, where);
}

void print_topology(const topology::Topology& topo) {
  fmt::print("Topology: {}, {}, {}, {}\n", plural(topo.packages.size(), "package"),
             plural(topo.numa_nodes.size(), "NUMA node"), plural(topo.cores.size(), "core"),
             plural(topo.pus().size(), "PU"));
  for (const auto& package : topo.packages) {
    fmt::print("  package {}: PUs {}\n", package.os_index, topology::format_cpu_list(package.pus));
  }
  for (const auto& node : topo.numa_nodes) {
    size_t cores = 0;
    for (const auto& core : topo.cores)
      cores += core.numa_node == node.os_index ? 1 : 0;
    fmt::print("  NUMA {}: {}, {}, PUs {}\n", node.os_index, format_bytes(node.memory_bytes),
               plural(cores, "core"),
               node.pus.empty() ? "none" : topology::format_cpu_list(node.pus));
  }
  // Hybrid CPUs and SMT-off cores make this uneven, so print the range rather than assume.
  size_t fewest = SIZE_MAX, most = 0;
  for (const auto& core : topo.cores) {
    fewest = std::min(fewest, core.pus.size());
    most = std::max(most, core.pus.size());
  }
  if (!topo.cores.empty()) {
    fmt::print("  cores: {} PU{} each\n",
               fewest == most ? fmt::format("{}", most) : fmt::format("{}-{}", fewest, most),
               most == 1 ? "" : "s");
  }
  if (topo.nics.empty()) fmt::print("  NICs: none\n");
  for (const auto& nic : topo.nics)
    print_device(topo, nic);
  if (topo.gpus.empty()) fmt::print("  GPUs: none\n");
  for (const auto& gpu : topo.gpus)
    print_device(topo, gpu);
}

int run_info(const InfoOptions& options) {
  if (options.memory.memory) return print_memory(options.memory, options.json);
  int status = 0;
  std::vector<fabric::Capabilities> providers;
  // A broken libfabric setup should not hide the topology: report it and still print the rest.
  try {
    providers = fabric::list_providers(options.provider);
  } catch (const Error& e) {
    std::fprintf(stderr, "proxyep info: cannot list providers: %s\n", e.what());
    status = 1;
  }
  if (providers.empty() && !options.provider.empty()) {
    std::fprintf(stderr, "proxyep info: no provider matches '%s'\n", options.provider.c_str());
    status = 1;
  }
  const topology::Topology topo = topology::discover();

  if (options.json) {
    auto providers_json = nlohmann::json::array();
    for (const auto& caps : providers)
      providers_json.push_back(caps.to_json());
    const nlohmann::json document = {{"providers", std::move(providers_json)},
                                     {"topology", topo.to_json()}};
    fmt::print("{}\n", document.dump(2));
    return status;
  }
  print_providers(providers, options.provider);
  print_topology(topo);
  return status;
}

}  // namespace

void register_info(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("info", "print fabric providers and the host topology");
  auto options = std::make_shared<InfoOptions>();
  cmd->add_flag("--json", options->json, "one JSON document on stdout");
  cmd->add_option("--provider", options->provider,
                  "only this libfabric provider, e.g. tcp, shm, efa, verbs");
  add_memory_options(*cmd, options->memory);
  cmd->callback([&action, options] { action = [options] { return run_info(*options); }; });
}

}  // namespace proxyep::tools
