#include "common/error.hpp"
#include "common/topology.hpp"

#include <doctest/doctest.h>
#include <hwloc.h>
#include <sched.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <thread>

using namespace proxyep;
using namespace proxyep::topology;

namespace {

// The CPUs the kernel currently lets this thread run on (narrower than the cgroup under taskset).
std::vector<int> affinity_pus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> pus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) pus.push_back(cpu);
  }
  return pus;
}

// Runs `body` on a fresh thread so pinning never leaks into the test runner's own thread.
template <typename Body>
void on_fresh_thread(Body body) {
  std::thread thread(body);
  thread.join();
}

bool contains(const std::vector<int>& list, int value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// Two packages, one NUMA node each, 2 cores x 2 PUs per package. Package 1 holds an H200 (with
// a CUDA OS device) and a ConnectX NIC (ib0 + mlx5_0); package 0 a BMC display (card0, not a
// GPU for us); the machine root holds a NIC and a GPU hwloc could not place.
constexpr const char kTwoSocketXml[] = R"xml(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0xff" complete_cpuset="0xff" allowed_cpuset="0xff" nodeset="0x3" complete_nodeset="0x3" allowed_nodeset="0x3">
  <object type="Package" os_index="0" cpuset="0x0f" complete_cpuset="0x0f" nodeset="0x1" complete_nodeset="0x1">
   <object type="NUMANode" os_index="0" cpuset="0x0f" complete_cpuset="0x0f" nodeset="0x1" complete_nodeset="0x1" local_memory="1073741824"/>
   <object type="Core" os_index="0" cpuset="0x03" complete_cpuset="0x03" nodeset="0x1" complete_nodeset="0x1">
    <object type="PU" os_index="0" cpuset="0x01" complete_cpuset="0x01" nodeset="0x1" complete_nodeset="0x1"/>
    <object type="PU" os_index="1" cpuset="0x02" complete_cpuset="0x02" nodeset="0x1" complete_nodeset="0x1"/>
   </object>
   <object type="Core" os_index="1" cpuset="0x0c" complete_cpuset="0x0c" nodeset="0x1" complete_nodeset="0x1">
    <object type="PU" os_index="2" cpuset="0x04" complete_cpuset="0x04" nodeset="0x1" complete_nodeset="0x1"/>
    <object type="PU" os_index="3" cpuset="0x08" complete_cpuset="0x08" nodeset="0x1" complete_nodeset="0x1"/>
   </object>
   <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[02-02]">
    <object type="PCIDev" pci_busid="0000:02:00.0" pci_type="0300 [1a03:2000] [1a03:2000] 41">
     <object type="OSDev" name="card0" osdev_type="1"/>
    </object>
   </object>
  </object>
  <object type="Package" os_index="1" cpuset="0xf0" complete_cpuset="0xf0" nodeset="0x2" complete_nodeset="0x2">
   <object type="NUMANode" os_index="1" cpuset="0xf0" complete_cpuset="0xf0" nodeset="0x2" complete_nodeset="0x2" local_memory="2147483648"/>
   <object type="Core" os_index="0" cpuset="0x30" complete_cpuset="0x30" nodeset="0x2" complete_nodeset="0x2">
    <object type="PU" os_index="4" cpuset="0x10" complete_cpuset="0x10" nodeset="0x2" complete_nodeset="0x2"/>
    <object type="PU" os_index="5" cpuset="0x20" complete_cpuset="0x20" nodeset="0x2" complete_nodeset="0x2"/>
   </object>
   <object type="Core" os_index="1" cpuset="0xc0" complete_cpuset="0xc0" nodeset="0x2" complete_nodeset="0x2">
    <object type="PU" os_index="6" cpuset="0x40" complete_cpuset="0x40" nodeset="0x2" complete_nodeset="0x2"/>
    <object type="PU" os_index="7" cpuset="0x80" complete_cpuset="0x80" nodeset="0x2" complete_nodeset="0x2"/>
   </object>
   <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[17-18]">
    <object type="PCIDev" pci_busid="0000:17:00.0" pci_type="0302 [10de:2335] [10de:18be] a1">
     <object type="OSDev" name="cuda0" subtype="CUDA" osdev_type="5">
      <info name="GPUModel" value="NVIDIA H200"/>
     </object>
    </object>
    <object type="PCIDev" pci_busid="0000:18:00.0" pci_type="0207 [15b3:1021] [15b3:0023] 00">
     <object type="OSDev" name="ib0" osdev_type="2"/>
     <object type="OSDev" name="mlx5_0" osdev_type="3"/>
    </object>
   </object>
  </object>
  <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[40-40]">
   <object type="PCIDev" pci_busid="0000:40:00.0" pci_type="0302 [10de:2335] [10de:18be] a1"/>
   <object type="PCIDev" pci_busid="0000:40:01.0" pci_type="0200 [8086:1592] [8086:0002] 02">
    <object type="OSDev" name="eth9" osdev_type="2"/>
   </object>
  </object>
 </object>
</topology>)xml";

const Device* find_device(const std::vector<Device>& devices, const std::string& name) {
  for (const auto& device : devices) {
    if (device.name == name) return &device;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("the topology loads with at least one core, each core with at least one PU") {
  const Topology topo = discover();
  REQUIRE(!topo.cores.empty());
  CHECK(!topo.numa_nodes.empty());  // hwloc 2 always reports at least one NUMA node
  std::set<int> seen;
  for (const auto& core : topo.cores) {
    CHECK(!core.pus.empty());
    for (int pu : core.pus)
      CHECK_MESSAGE(seen.insert(pu).second, "PU ", pu, " in two cores");
  }
  const auto pus = topo.pus();
  CHECK(pus.size() == seen.size());
  CHECK(std::is_sorted(pus.begin(), pus.end()));
}

TEST_CASE("the PU count matches hwloc's allowed set and covers the thread's affinity") {
  const Hwloc hwloc;
  const Topology topo = hwloc.snapshot();
  const auto pus = topo.pus();
  // Cgroups may hide CPUs from this process; the topology must report exactly the allowed ones.
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(hwloc.native());
  CHECK(pus.size() == static_cast<size_t>(hwloc_bitmap_weight(allowed)));
  // The kernel never lets affinity reach outside the cgroup, so every CPU we may run on is in.
  const auto affinity = affinity_pus();
  REQUIRE(!affinity.empty());
  for (int cpu : affinity)
    CHECK_MESSAGE(contains(pus, cpu), "CPU ", cpu, " missing");
  CHECK(pus.size() >= affinity.size());
  CHECK(std::thread::hardware_concurrency() >= 1);
}

TEST_CASE("cores name a known NUMA node and package") {
  const Topology topo = discover();
  std::vector<int> nodes;
  for (const auto& node : topo.numa_nodes)
    nodes.push_back(node.os_index);
  std::vector<int> packages;
  for (const auto& package : topo.packages)
    packages.push_back(package.os_index);
  for (const auto& core : topo.cores) {
    CHECK((core.numa_node == -1 || contains(nodes, core.numa_node)));
    CHECK((core.package == -1 || contains(packages, core.package)));
  }
  uint64_t memory = 0;
  for (const auto& node : topo.numa_nodes)
    memory += node.memory_bytes;
  CHECK(memory > 0);
}

TEST_CASE("devices carry a name and a locality inside the reported PUs") {
  const Topology topo = discover();
  const auto pus = topo.pus();
  auto check_device = [&](const Device& device) {
    CHECK(!device.name.empty());
    for (int pu : device.near_pus)
      CHECK(contains(pus, pu));
    if (!device.pci_bus_id.empty()) CHECK(device.pci_bus_id.size() == 12);  // 0000:00:03.0
    const auto near = topo.cores_near(device);
    CHECK(!near.empty());
  };
  for (const auto& nic : topo.nics) {
    CHECK(nic.kind != DeviceKind::gpu);
    check_device(nic);
  }
  for (const auto& gpu : topo.gpus) {
    CHECK(gpu.kind == DeviceKind::gpu);
    check_device(gpu);
  }
}

TEST_CASE("cores_near picks the cores inside the locality and falls back to every core") {
  const Topology topo = discover();
  REQUIRE(!topo.cores.empty());

  Device unknown;  // no locality at all
  CHECK(topo.cores_near(unknown).size() == topo.cores.size());

  Device elsewhere;  // a locality no reported core lies in (a cgroup that hides the NIC's cores)
  elsewhere.near_pus = {1 << 20};
  CHECK(topo.cores_near(elsewhere).size() == topo.cores.size());

  Device first_core;
  first_core.near_pus = topo.cores.front().pus;
  const auto near = topo.cores_near(first_core);
  REQUIRE(near.size() == 1);
  CHECK(near.front().pus == topo.cores.front().pus);
  CHECK(pus_of(near) == topo.cores.front().pus);

  Device everywhere;
  everywhere.near_pus = topo.pus();
  CHECK(pus_of(topo.cores_near(everywhere)) == topo.pus());
}

TEST_CASE("to_json has one entry per object with the documented fields") {
  const Topology topo = discover();
  const nlohmann::json json = topo.to_json();
  for (const char* key : {"packages", "numa_nodes", "cores", "nics", "gpus"}) {
    REQUIRE_MESSAGE(json.contains(key), key);
    CHECK(json[key].is_array());
  }
  CHECK(json["packages"].size() == topo.packages.size());
  CHECK(json["numa_nodes"].size() == topo.numa_nodes.size());
  CHECK(json["cores"].size() == topo.cores.size());
  CHECK(json["nics"].size() == topo.nics.size());
  CHECK(json["gpus"].size() == topo.gpus.size());
  const auto& core = json["cores"][0];
  CHECK(core["pus"].get<std::vector<int>>() == topo.cores[0].pus);
  CHECK(core["numa_node"].get<int>() == topo.cores[0].numa_node);
  CHECK(json["numa_nodes"][0]["memory_bytes"].get<uint64_t>() == topo.numa_nodes[0].memory_bytes);
  for (const auto& nic : json["nics"]) {
    for (const char* key : {"kind", "name", "pci_bus_id", "numa_nodes", "near_pus"}) {
      CHECK_MESSAGE(nic.contains(key), key);
    }
  }
  CHECK(nlohmann::json::parse(json.dump()) == json);
}

TEST_CASE("pinning to each allowed PU moves the thread there") {
  const auto pus = discover().pus();
  REQUIRE(!pus.empty());
  // The first PU plus a few more: enough to prove the binding follows the argument.
  const size_t count = std::min<size_t>(pus.size(), 4);
  for (size_t i = 0; i < count; ++i) {
    const int pu = pus[i];
    CAPTURE(pu);
    bool pinned = false;
    int running_on = -1;
    std::vector<int> affinity;
    on_fresh_thread([&] {
      pinned = pin_current_thread({pu});
      running_on = sched_getcpu();
      affinity = affinity_pus();
    });
    CHECK(pinned);
    CHECK(running_on == pu);
    CHECK(affinity == std::vector<int>{pu});
  }
}

TEST_CASE("pinning to an unavailable PU returns false and leaves the thread alone") {
  on_fresh_thread([] {
    const auto before = affinity_pus();
    CHECK_FALSE(pin_current_thread({}));
    CHECK_FALSE(pin_current_thread({-1}));
    CHECK_FALSE(pin_current_thread({1 << 20}));
    CHECK_FALSE(pin_current_thread({discover().pus().front(), 1 << 20}));
    CHECK(affinity_pus() == before);
  });
}

TEST_CASE("a moved-from Hwloc refuses to snapshot; the moved-to one works") {
  Hwloc first(false);
  Hwloc second(std::move(first));
  CHECK(second.native() != nullptr);
  CHECK(!second.snapshot().cores.empty());
  try {
    (void)first.snapshot();  // NOLINT(bugprone-use-after-move): the point of the test
    FAIL("snapshot of a moved-from Hwloc returned");
  } catch (const Error& e) {
    CHECK(e.phase() == "topology");
  }
  Hwloc third(false);
  third = std::move(second);
  CHECK(third.native() != nullptr);
}

TEST_CASE("format_cpu_list writes the kernel's cpu-list format") {
  CHECK(format_cpu_list({}) == "");
  CHECK(format_cpu_list({5}) == "5");
  CHECK(format_cpu_list({3, 0, 1, 2, 8, 11, 10, 8}) == "0-3,8,10-11");
  CHECK(format_cpu_list({0, 2, 4}) == "0,2,4");
}

TEST_CASE("cpu lists parse like the kernel's, and back") {
  CHECK(parse_cpu_list("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5,1,1") == std::vector<int>{1, 5});
  CHECK(format_cpu_list(parse_cpu_list("10-11,0-3,8")) == "0-3,8,10-11");
  // A CPU id no machine has would make a list of billions of entries.
  for (const char* bad : {"", "a", "1-", "3-1", "1,,2", "-2", "1 ,2", "0-2000000000", "65536"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_cpu_list(bad), Error);
  }
  CHECK(parse_cpu_list("65535") == std::vector<int>{65535});
}

TEST_CASE("device kinds have names") {
  CHECK(to_string(DeviceKind::network) == "network");
  CHECK(to_string(DeviceKind::openfabrics) == "openfabrics");
  CHECK(to_string(DeviceKind::gpu) == "gpu");
}

TEST_CASE("an exported two-socket topology: cores, NUMA nodes and packages") {
  const Topology topo = Hwloc::from_xml(kTwoSocketXml).snapshot();
  REQUIRE(topo.packages.size() == 2);
  CHECK(topo.packages[1].os_index == 1);
  CHECK(topo.packages[1].pus == std::vector<int>{4, 5, 6, 7});
  REQUIRE(topo.numa_nodes.size() == 2);
  CHECK(topo.numa_nodes[0].memory_bytes == (uint64_t{1} << 30));
  CHECK(topo.numa_nodes[1].memory_bytes == (uint64_t{2} << 30));
  REQUIRE(topo.cores.size() == 4);
  CHECK(topo.cores[2].index == 2);
  CHECK(topo.cores[2].os_index == 0);  // core ids restart in every package
  CHECK(topo.cores[2].package == 1);
  CHECK(topo.cores[2].numa_node == 1);
  CHECK(topo.cores[2].pus == std::vector<int>{4, 5});
  CHECK(topo.pus() == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("an exported two-socket topology: NICs and GPUs with their locality") {
  const Topology topo = Hwloc::from_xml(kTwoSocketXml).snapshot();
  REQUIRE(topo.nics.size() == 3);
  const Device* ib0 = find_device(topo.nics, "ib0");
  const Device* mlx5 = find_device(topo.nics, "mlx5_0");
  const Device* eth9 = find_device(topo.nics, "eth9");
  REQUIRE((ib0 && mlx5 && eth9));
  CHECK(ib0->kind == DeviceKind::network);
  CHECK(mlx5->kind == DeviceKind::openfabrics);
  CHECK(mlx5->pci_bus_id == "0000:18:00.0");
  CHECK(mlx5->numa_nodes == std::vector<int>{1});
  CHECK(mlx5->near_pus == std::vector<int>{4, 5, 6, 7});
  CHECK(pus_of(topo.cores_near(*mlx5)) == std::vector<int>{4, 5, 6, 7});
  // Hung off the machine root of a two-node host: hwloc did not know where it is.
  CHECK_FALSE(eth9->locality_known());
  CHECK(eth9->numa_nodes.empty());
  CHECK(topo.cores_near(*eth9).size() == 4);

  // The BMC's display (ASPEED, class 0x0300, DRM device card0) is not a GPU for ProxyEP.
  REQUIRE(topo.gpus.size() == 2);
  const Device* cuda0 = find_device(topo.gpus, "cuda0");
  REQUIRE(cuda0 != nullptr);
  CHECK(cuda0->model == "NVIDIA H200");
  CHECK(cuda0->pci_bus_id == "0000:17:00.0");
  CHECK(cuda0->numa_nodes == std::vector<int>{1});
  CHECK(pus_of(topo.cores_near(*cuda0)) == std::vector<int>{4, 5, 6, 7});
  // A GPU seen only on PCI (no CUDA/NVML plugin in this hwloc) is still reported.
  const Device* bare = find_device(topo.gpus, "gpu@0000:40:00.0");
  REQUIRE(bare != nullptr);
  CHECK(bare->model.empty());
  CHECK_FALSE(bare->locality_known());

  const nlohmann::json json = topo.to_json();
  CHECK(json["gpus"][0]["name"] == "cuda0");
  CHECK(json["gpus"][0]["kind"] == "gpu");
  CHECK(json["gpus"][0]["near_pus"].get<std::vector<int>>() == std::vector<int>{4, 5, 6, 7});
  CHECK(json["gpus"][1]["locality_known"] == false);
}

TEST_CASE("a topology of another machine refuses to pin, and bad XML is a topology error") {
  const Hwloc other = Hwloc::from_xml(kTwoSocketXml);
  on_fresh_thread([&] {
    const auto before = affinity_pus();
    CHECK_FALSE(other.pin_current_thread({0}));
    CHECK(affinity_pus() == before);
  });
  try {
    (void)Hwloc::from_xml("<topology> not really");
    FAIL("malformed XML loaded");
  } catch (const Error& e) {
    CHECK(e.phase() == "topology");
  }
}
