#include "common/topology.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <fmt/format.h>
#include <hwloc.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

namespace proxyep::topology {
namespace {

constexpr uint16_t kNvidiaVendorId = 0x10de;
constexpr uint16_t kPciClassVga = 0x0300;
constexpr uint16_t kPciClass3d = 0x0302;  // data-centre GPUs (A100, H100, H200) report this

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* bitmap) const { hwloc_bitmap_free(bitmap); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};

// strerror() shares a static buffer between threads; the system category does not.
std::string errno_text(int error) {
  return fmt::format("{} (errno {})", std::system_category().message(error), error);
}

// hwloc marks objects without an OS number with HWLOC_UNKNOWN_INDEX; callers see -1.
int os_index_of(const hwloc_obj* obj) {
  return obj->os_index == HWLOC_UNKNOWN_INDEX ? -1 : static_cast<int>(obj->os_index);
}

std::vector<int> bitmap_to_list(hwloc_const_bitmap_t bitmap) {
  std::vector<int> ids;
  if (bitmap == nullptr || hwloc_bitmap_isfull(bitmap)) return ids;  // infinite: unknown
  for (int id = hwloc_bitmap_first(bitmap); id != -1; id = hwloc_bitmap_next(bitmap, id)) {
    ids.push_back(id);
  }
  return ids;
}

std::string pci_bus_id_of(const hwloc_obj* obj) {
  for (; obj != nullptr; obj = obj->parent) {
    if (obj->type != HWLOC_OBJ_PCI_DEVICE) continue;
    const auto& pci = obj->attr->pcidev;
    return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
  }
  return {};
}

const char* info_or_null(hwloc_obj_t obj, const char* key) {
  return obj == nullptr ? nullptr : hwloc_obj_get_info_by_name(obj, key);
}

// NUMA nodes and PUs of the closest non-I/O ancestor. When that ancestor is the machine itself
// on a multi-NUMA host, hwloc did not know where the device sits: report nothing rather than
// claim the device is near every core.
void fill_locality(hwloc_topology_t topology, hwloc_obj_t io_obj, Device& device) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, io_obj);
  if (ancestor == nullptr) return;
  const bool at_root = ancestor->parent == nullptr;
  if (at_root && hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE) > 1) return;
  device.numa_nodes = bitmap_to_list(ancestor->nodeset);
  device.near_pus = bitmap_to_list(ancestor->cpuset);
}

void read_packages(hwloc_topology_t topology, Topology& out) {
  hwloc_obj_t obj = nullptr;
  while ((obj = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_PACKAGE, obj)) != nullptr) {
    out.packages.push_back({os_index_of(obj), bitmap_to_list(obj->cpuset)});
  }
}

void read_numa_nodes(hwloc_topology_t topology, Topology& out) {
  hwloc_obj_t obj = nullptr;
  while ((obj = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, obj)) != nullptr) {
    out.numa_nodes.push_back(
        {os_index_of(obj), obj->attr->numanode.local_memory, bitmap_to_list(obj->cpuset)});
  }
}

// First NUMA node whose CPUs contain all of `cpuset` (on hosts with HBM or CXL memory a core
// can be local to several nodes; the first is the ordinary DRAM one).
int numa_node_of(hwloc_topology_t topology, hwloc_const_cpuset_t cpuset) {
  hwloc_obj_t node = nullptr;
  while ((node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) != nullptr) {
    if (!hwloc_bitmap_iszero(node->cpuset) && hwloc_bitmap_isincluded(cpuset, node->cpuset)) {
      return os_index_of(node);
    }
  }
  return -1;
}

// Cores, or PUs standing in for cores on platforms where hwloc reports no Core objects.
void read_cores(hwloc_topology_t topology, Topology& out) {
  const hwloc_obj_type_t type =
      hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  hwloc_obj_t obj = nullptr;
  while ((obj = hwloc_get_next_obj_by_type(topology, type, obj)) != nullptr) {
    Core core;
    core.index = static_cast<int>(obj->logical_index);
    core.os_index = os_index_of(obj);
    hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topology, HWLOC_OBJ_PACKAGE, obj);
    core.package = package == nullptr ? -1 : os_index_of(package);
    core.numa_node = numa_node_of(topology, obj->cpuset);
    core.pus = bitmap_to_list(obj->cpuset);
    out.cores.push_back(std::move(core));
  }
}

bool is_nvidia_gpu_pci(const hwloc_obj* obj) {
  if (obj == nullptr || obj->type != HWLOC_OBJ_PCI_DEVICE) return false;
  const auto& pci = obj->attr->pcidev;
  return pci.vendor_id == kNvidiaVendorId &&
         (pci.class_id == kPciClass3d || pci.class_id == kPciClassVga);
}

// CUDA ("cuda0") and NVML ("nvml0") OS devices exist only when hwloc was built with those
// plugins; DRM devices ("card1") are skipped because a server's BMC display shows up there too.
bool is_cuda_or_nvml(const hwloc_obj* obj) {
  return obj->subtype != nullptr &&
         (std::strcmp(obj->subtype, "CUDA") == 0 || std::strcmp(obj->subtype, "NVML") == 0);
}

void read_nics(hwloc_topology_t topology, Topology& out) {
  hwloc_obj_t obj = nullptr;
  while ((obj = hwloc_get_next_osdev(topology, obj)) != nullptr) {
    const auto type = obj->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    Device nic;
    nic.kind = type == HWLOC_OBJ_OSDEV_NETWORK ? DeviceKind::network : DeviceKind::openfabrics;
    nic.name = obj->name == nullptr ? "" : obj->name;
    nic.pci_bus_id = pci_bus_id_of(obj);
    fill_locality(topology, obj, nic);
    out.nics.push_back(std::move(nic));
  }
}

// One entry per physical GPU: NVIDIA PCI functions first (named after their CUDA/NVML OS device
// when there is one), then CUDA/NVML OS devices hwloc could not tie to a PCI function.
void read_gpus(hwloc_topology_t topology, Topology& out) {
  hwloc_obj_t pci = nullptr;
  while ((pci = hwloc_get_next_pcidev(topology, pci)) != nullptr) {
    if (!is_nvidia_gpu_pci(pci)) continue;
    Device gpu;
    gpu.kind = DeviceKind::gpu;
    gpu.pci_bus_id = pci_bus_id_of(pci);
    for (hwloc_obj_t child = pci->io_first_child; child != nullptr; child = child->next_sibling) {
      if (child->type != HWLOC_OBJ_OS_DEVICE || !is_cuda_or_nvml(child)) continue;
      if (gpu.name.empty() && child->name != nullptr) gpu.name = child->name;
      if (const char* model = info_or_null(child, "GPUModel"); gpu.model.empty() && model) {
        gpu.model = model;
      }
    }
    if (gpu.name.empty()) gpu.name = "gpu@" + gpu.pci_bus_id;
    fill_locality(topology, pci, gpu);
    out.gpus.push_back(std::move(gpu));
  }
  hwloc_obj_t osdev = nullptr;
  while ((osdev = hwloc_get_next_osdev(topology, osdev)) != nullptr) {
    if (!is_cuda_or_nvml(osdev) || is_nvidia_gpu_pci(osdev->parent)) continue;
    Device gpu;
    gpu.kind = DeviceKind::gpu;
    gpu.name = osdev->name == nullptr ? "" : osdev->name;
    if (const char* model = info_or_null(osdev, "GPUModel")) gpu.model = model;
    fill_locality(topology, osdev, gpu);
    out.gpus.push_back(std::move(gpu));
  }
}

// Loads a topology of this host, or of `xml` (an `lstopo --of xml` export) when given.
hwloc_topology* load_topology(bool io_devices, const std::string* xml) {
  // hwloc unloads its plugins (dlclose) when the last topology is destroyed, at exit for the
  // static one pin_current_thread keeps; what the PCI plugin allocated then hangs off no mapped
  // module, and LeakSanitizer reports ~1 KB from "<unknown module>" (no frame to suppress) and
  // fails every sanitizer run that opens a fabric. One topology that is never destroyed keeps
  // the plugins loaded for the life of the process.
  static hwloc_topology_t const keep_plugins_loaded = [] {
    hwloc_topology_t kept = nullptr;
    return hwloc_topology_init(&kept) == 0 ? kept : nullptr;
  }();
  (void)keep_plugins_loaded;
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) {
    fail("topology", "hwloc_topology_init failed: {}", errno_text(errno));
  }
  // Released on every failure below.
  std::unique_ptr<hwloc_topology, TopologyDeleter> guard(topology);
  if (io_devices &&
      hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
    fail("topology", "hwloc_topology_set_io_types_filter failed: {}", errno_text(errno));
  }
  if (xml != nullptr &&
      hwloc_topology_set_xmlbuffer(topology, xml->data(), static_cast<int>(xml->size()) + 1) != 0) {
    fail("topology", "hwloc rejected the XML topology ({} bytes): {}", xml->size(),
         errno_text(errno));
  }
  if (hwloc_topology_load(topology) != 0) {
    fail("topology", "hwloc_topology_load failed: {}", errno_text(errno));
  }
  return guard.release();
}

nlohmann::json device_json(const Device& device) {
  return {{"kind", to_string(device.kind)},           {"name", device.name},
          {"pci_bus_id", device.pci_bus_id},          {"model", device.model},
          {"numa_nodes", device.numa_nodes},          {"near_pus", device.near_pus},
          {"locality_known", device.locality_known()}};
}

}  // namespace

std::string_view to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::network:
      return "network";
    case DeviceKind::openfabrics:
      return "openfabrics";
    case DeviceKind::gpu:
      return "gpu";
  }
  return "unknown";
}

std::vector<int> Topology::pus() const {
  std::vector<int> all;
  for (const auto& core : cores)
    all.insert(all.end(), core.pus.begin(), core.pus.end());
  std::sort(all.begin(), all.end());
  return all;
}

std::vector<Core> Topology::cores_near(const Device& device) const {
  std::vector<Core> near;
  for (const auto& core : cores) {
    const bool inside = std::all_of(core.pus.begin(), core.pus.end(), [&](int pu) {
      return std::find(device.near_pus.begin(), device.near_pus.end(), pu) != device.near_pus.end();
    });
    if (inside && !core.pus.empty()) near.push_back(core);
  }
  return near.empty() ? cores : near;
}

nlohmann::json Topology::to_json() const {
  auto json = nlohmann::json::object();
  auto& packages_json = json["packages"] = nlohmann::json::array();
  for (const auto& p : packages)
    packages_json.push_back({{"os_index", p.os_index}, {"pus", p.pus}});
  auto& numa_json = json["numa_nodes"] = nlohmann::json::array();
  for (const auto& n : numa_nodes) {
    numa_json.push_back(
        {{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"pus", n.pus}});
  }
  auto& cores_json = json["cores"] = nlohmann::json::array();
  for (const auto& c : cores) {
    cores_json.push_back({{"index", c.index},
                          {"os_index", c.os_index},
                          {"package", c.package},
                          {"numa_node", c.numa_node},
                          {"pus", c.pus}});
  }
  auto& nics_json = json["nics"] = nlohmann::json::array();
  for (const auto& d : nics)
    nics_json.push_back(device_json(d));
  auto& gpus_json = json["gpus"] = nlohmann::json::array();
  for (const auto& d : gpus)
    gpus_json.push_back(device_json(d));
  return json;
}

std::vector<int> pus_of(const std::vector<Core>& cores) {
  std::vector<int> pus;
  for (const auto& core : cores)
    pus.insert(pus.end(), core.pus.begin(), core.pus.end());
  std::sort(pus.begin(), pus.end());
  return pus;
}

std::string format_cpu_list(std::vector<int> pus) {
  std::sort(pus.begin(), pus.end());
  pus.erase(std::unique(pus.begin(), pus.end()), pus.end());
  std::string text;
  for (size_t i = 0; i < pus.size();) {
    size_t j = i;
    while (j + 1 < pus.size() && pus[j + 1] == pus[j] + 1)
      ++j;
    if (!text.empty()) text += ',';
    text += j == i ? fmt::format("{}", pus[i]) : fmt::format("{}-{}", pus[i], pus[j]);
    i = j + 1;
  }
  return text;
}

namespace {

int parse_cpu(std::string_view text, std::string_view whole) {
  int value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(ec == std::errc() && end == text.data() + text.size() && value >= 0, "cpu list",
          "'{}' is not a cpu list like \"0-3,8\" (bad entry '{}')", whole, text);
  require(value < kMaxCpu, "cpu list", "'{}' names CPU {}; CPUs are numbered below {}", whole,
          value, kMaxCpu);
  return value;
}

}  // namespace

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  std::string_view rest = text;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    auto dash = item.find('-');
    int lo = parse_cpu(item.substr(0, dash), text);
    int hi = dash == std::string_view::npos ? lo : parse_cpu(item.substr(dash + 1), text);
    require(lo <= hi, "cpu list", "'{}': range {} is backwards", text, item);
    for (int cpu = lo; cpu <= hi; ++cpu)
      cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  require(!cpus.empty(), "cpu list", "the cpu list '{}' names no CPU", text);
  return cpus;
}

Hwloc::Hwloc(bool io_devices) : topology_(load_topology(io_devices, nullptr)) {}

Hwloc Hwloc::from_xml(const std::string& xml) {
  Hwloc hwloc(nullptr);
  hwloc.topology_ = load_topology(true, &xml);
  return hwloc;
}

Hwloc::~Hwloc() {
  if (topology_ != nullptr) hwloc_topology_destroy(topology_);
}

Hwloc::Hwloc(Hwloc&& other) noexcept : topology_(std::exchange(other.topology_, nullptr)) {}

Hwloc& Hwloc::operator=(Hwloc&& other) noexcept {
  if (this != &other) {
    if (topology_ != nullptr) hwloc_topology_destroy(topology_);
    topology_ = std::exchange(other.topology_, nullptr);
  }
  return *this;
}

Topology Hwloc::snapshot() const {
  require(topology_ != nullptr, "topology", "snapshot of a moved-from Hwloc");
  Topology out;
  read_packages(topology_, out);
  read_numa_nodes(topology_, out);
  read_cores(topology_, out);
  read_nics(topology_, out);
  read_gpus(topology_, out);
  return out;
}

bool Hwloc::pin_current_thread(const std::vector<int>& pus) const {
  if (topology_ == nullptr || pus.empty()) {
    log::warn("topology: not pinning thread: {}", pus.empty() ? "no CPUs given" : "no topology");
    return false;
  }
  Bitmap set(hwloc_bitmap_alloc());
  if (!set) {
    log::warn("topology: not pinning thread: out of memory");
    return false;
  }
  // A topology read from XML describes another machine; binding through it would silently
  // do nothing, so refuse instead.
  if (!hwloc_topology_is_thissystem(topology_)) {
    log::warn("topology: not pinning thread: the topology is not this host's");
    return false;
  }
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topology_);
  for (int pu : pus) {
    if (pu < 0 || !hwloc_bitmap_isset(allowed, static_cast<unsigned>(pu))) {
      log::warn(
          "topology: not pinning thread to CPUs {}: CPU {} is not available here "
          "(allowed: {})",
          format_cpu_list(pus), pu, format_cpu_list(bitmap_to_list(allowed)));
      return false;
    }
    hwloc_bitmap_set(set.get(), static_cast<unsigned>(pu));
  }
  // Binding reads the topology without modifying it, so concurrent calls on one topology are
  // safe (hwloc's thread-safety rules).
  if (hwloc_set_cpubind(topology_, set.get(), HWLOC_CPUBIND_THREAD) != 0) {
    const int error = errno;  // before formatting, which may allocate and touch errno
    log::warn("topology: the OS refused to pin this thread to CPUs {}: {}", format_cpu_list(pus),
              errno_text(error));
    return false;
  }
  return true;
}

Topology discover() {
  return Hwloc(true).snapshot();
}

const Topology& discovered() {
  static std::mutex mutex;
  static std::unique_ptr<const Topology> snapshot;
  std::lock_guard lock(mutex);
  if (!snapshot) snapshot = std::make_unique<const Topology>(discover());
  return *snapshot;
}

bool pin_current_thread(const std::vector<int>& pus) {
  // Binding needs a handle but no I/O devices; load the cheap CPU-only topology once.
  static const Hwloc cpu_only(false);
  return cpu_only.pin_current_thread(pus);
}

}  // namespace proxyep::topology
