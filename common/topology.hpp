// Host topology from hwloc: packages, NUMA nodes, physical cores, NICs and GPUs with their
// locality. Proxy threads default to the cores nearest their NIC or GPU (DESIGN.md: thread count
// and pinning default from hwloc topology), so this is what the proxy layer asks "where should
// I run?", and what `proxyep info` prints.
//
// Two pieces:
// - Hwloc: an RAII owner of one loaded hwloc_topology_t (with I/O devices, so NICs and GPUs
//   appear). Loading takes milliseconds to tens of milliseconds: load once, snapshot, reuse.
// - Topology: a plain-value snapshot that holds no hwloc pointers, so it can be copied between
//   threads, stored in configuration and serialised.
//
// Every CPU number here is a PU os-index, the number the kernel uses (taskset, sched_getcpu()).
// Only PUs this process may use (its cgroup cpuset) are reported: hwloc drops the others.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// hwloc's handle type, declared here so users of this header need not pull in <hwloc.h>;
// topology.cpp includes the real header, so a mismatch fails to compile there.
struct hwloc_topology;

namespace proxyep::topology {

struct Package {
  int os_index = -1;
  std::vector<int> pus;
};

struct NumaNode {
  int os_index = -1;
  uint64_t memory_bytes = 0;  // local memory of this node
  std::vector<int> pus;       // empty for memory-only nodes (HBM, CXL expanders)
};

// One physical core: hyperthreads of the same core share its entry.
struct Core {
  int index = 0;       // hwloc logical index among the reported cores
  int os_index = -1;   // the kernel's core id (unique only within a package)
  int package = -1;    // package os-index, -1 when unknown
  int numa_node = -1;  // os-index of the first NUMA node covering the core, -1 when unknown
  std::vector<int> pus;
};

enum class DeviceKind { network, openfabrics, gpu };
std::string_view to_string(DeviceKind kind);

struct Device {
  DeviceKind kind = DeviceKind::network;
  std::string name;        // OS name: "eth0", "mlx5_0", "rdmap16s27", "cuda0"; "gpu@<bus id>" for
                           // a GPU seen only on PCI
  std::string pci_bus_id;  // "0000:17:00.0"; empty when the device is not on PCI
  std::string model;       // GPU model when hwloc knows it, else empty
  // Locality: the NUMA nodes and PUs of the closest non-I/O ancestor. Both are empty when hwloc
  // could not place the device (it then hangs the device off the whole machine on a multi-NUMA
  // host); cores_near() treats that as "anywhere".
  std::vector<int> numa_nodes;
  std::vector<int> near_pus;

  bool locality_known() const { return !near_pus.empty(); }
};

struct Topology {
  std::vector<Package> packages;
  std::vector<NumaNode> numa_nodes;
  std::vector<Core> cores;
  std::vector<Device> nics;  // network and openfabrics OS devices
  std::vector<Device> gpus;

  // Every PU of every core, ascending.
  std::vector<int> pus() const;
  // Cores whose PUs all lie in the device's locality. Falls back to every core when the
  // locality is unknown or no reported core lies inside it (e.g. the cgroup excludes them all),
  // because a proxy thread must run somewhere.
  std::vector<Core> cores_near(const Device& device) const;

  nlohmann::json to_json() const;
};

// The PUs of `cores`, ascending: what pin_current_thread() takes.
std::vector<int> pus_of(const std::vector<Core>& cores);

// "0-3,8,10-11": the kernel's cpu-list format (taskset -c, /sys/.../cpulist). Sorts and
// deduplicates; "" for an empty list.
std::string format_cpu_list(std::vector<int> pus);

// The other way: "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}, sorted and deduplicated. Throws
// proxyep::Error("cpu list") when malformed, empty, or naming a CPU at or above kMaxCpu.
inline constexpr int kMaxCpu = 1 << 16;
std::vector<int> parse_cpu_list(std::string_view text);

// RAII owner of a loaded hwloc topology of this host.
class Hwloc {
 public:
  // Loads the topology; `io_devices` keeps the important PCI and OS devices (NICs, GPUs), which
  // costs a sysfs walk. Throws proxyep::Error (phase "topology") when hwloc fails.
  explicit Hwloc(bool io_devices = true);
  // A topology exported elsewhere (`lstopo --of xml` on a production node), for planning
  // placement offline and for tests. Describes that machine: pinning through it returns false.
  static Hwloc from_xml(const std::string& xml);
  ~Hwloc();
  Hwloc(Hwloc&& other) noexcept;
  Hwloc& operator=(Hwloc&& other) noexcept;
  Hwloc(const Hwloc&) = delete;
  Hwloc& operator=(const Hwloc&) = delete;

  hwloc_topology* native() const { return topology_; }
  Topology snapshot() const;

  // Binds the calling thread to `pus`. Returns false, with a logged warning, when the list is
  // empty, names a PU this process may not use, or the OS refuses (restricted cgroups, seccomp):
  // running unpinned is slower, not wrong, so the caller decides whether that is fatal.
  bool pin_current_thread(const std::vector<int>& pus) const;

 private:
  explicit Hwloc(std::nullptr_t) {}

  hwloc_topology* topology_ = nullptr;
};

// Loads the topology with I/O devices and snapshots it. Throws proxyep::Error ("topology").
Topology discover();
// discover()'s snapshot, taken once per process (the first call; a failure is retried by the
// next call): loading hwloc with I/O devices takes 10-60 ms, which every proxy engine paid, and
// proxyepd builds one per attaching rank. Devices hot-plugged later are not seen.
const Topology& discovered();

// Hwloc::pin_current_thread() on a process-wide CPU-only topology loaded on first use (loading
// may throw proxyep::Error; binding failures return false).
bool pin_current_thread(const std::vector<int>& pus);

}  // namespace proxyep::topology
