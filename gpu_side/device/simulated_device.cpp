// The host-simulated device (simulated_device.hpp): construction, memory, rings. Kernels:
// simulated_kernels.cpp; events, signal words and synchronize: simulated_device_sync.cpp.
#include "gpu_side/device/simulated_device.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu_side/device/simulated_device_core.hpp"
#include "gpu_side/device/simulated_kernels.hpp"
#include "gpu_side/device/simulated_shared_handle.hpp"
#include "gpu_side/device/thread_access_key.hpp"
#include "gpu_side/ep/layout_rules.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::gpu_side::device {

namespace {

constexpr std::string_view kPhase = kSimulatedPhase;

uint64_t page_rounded(uint64_t bytes) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
}

}  // namespace

SimulatedDevice::SimulatedDevice(SimulatedDeviceOptions options)
    : SimulatedDevice(std::make_shared<Memory>(), options) {
  if (options.protect_device_memory) {
    core_->memory->key = ThreadAccessKey::allocate();
    core_->memory->gated = !core_->memory->key && options.gate_without_keys;
    if (core_->memory->gated)
      log::debug(
          "simulated device: no memory protection keys here; device memory is closed to the "
          "host while the device runs nothing (mprotect), open to every thread while it runs");
  }
  core_->worker = std::thread([core = core_.get()] { core->run(); });
}

SimulatedDevice::SimulatedDevice(std::shared_ptr<Memory> memory, SimulatedDeviceOptions options)
    : core_(std::make_shared<Core>()) {
  core_->options = options;
  core_->memory = std::move(memory);
}

std::shared_ptr<SimulatedDevice> SimulatedDevice::another_stream(
    SimulatedDeviceOptions options) const {
  // Not make_shared: the constructor that shares the memory is private.
  std::shared_ptr<SimulatedDevice> stream(new SimulatedDevice(core_->memory, options));
  stream->core_->worker = std::thread([core = stream->core_.get()] { core->run(); });
  return stream;
}

SimulatedDevice::~SimulatedDevice() {
  {
    std::lock_guard lock(core_->mutex);
    core_->stopping = true;
    core_->run_before = UINT64_MAX;  // what is still queued runs before the worker stops
  }
  core_->wake.notify_all();
  core_->worker.join();
  std::vector<std::function<void()>> releases;  // of a capture never ended: nothing launches it
  std::vector<Core::Capture::Joined> joined;
  {
    std::lock_guard lock(core_->mutex);
    core_->stopped = true;
    if (core_->capture && core_->capture->origin == core_.get()) {
      std::lock_guard recording(core_->capture->mutex);
      releases = std::move(core_->capture->releases);
      joined = std::move(core_->capture->joined);
    }
    core_->capture.reset();
  }
  // The streams that joined a capture no graph will come of record into it no more.
  for (const Core::Capture::Joined& j : joined) {
    std::lock_guard lock(j.stream->mutex);
    j.stream->capture.reset();
  }
  for (auto& release : releases)
    release();
}

SimulatedDevice::Core& SimulatedDevice::core() const {
  return *core_;
}

BoundKernels SimulatedDevice::kernels() {
  return {simulated_kernels(), *this};
}

bool SimulatedDevice::device_memory_protected() const {
  return core_->memory->key.has_value() || core_->memory->gated;
}

uint64_t SimulatedDevice::device_bytes_in_use() const {
  std::lock_guard lock(core_->memory->mutex);
  return core_->memory->device_bytes;
}

uint64_t SimulatedDevice::operations_run() const {
  std::lock_guard lock(core_->mutex);
  return core_->ops_run;
}

std::shared_ptr<std::byte[]> SimulatedDevice::allocate(uint64_t bytes) {
  return allocate_mapped(bytes, true);
}

NicMemory SimulatedDevice::allocate_for_nic(uint64_t bytes) {
  if (!core_->options.nic_reads_device_memory) return {};
  return {.memory = allocate_mapped(bytes, false), .bytes = bytes, .registers_as_host = true};
}

std::shared_ptr<std::byte[]> SimulatedDevice::allocate_mapped(uint64_t bytes, bool tagged) {
  const uint64_t mapped = page_rounded(bytes);
  void* memory =
      ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  require(memory != MAP_FAILED, kPhase, "allocate: {} bytes of device memory: {}", bytes,
          std::strerror(errno));
  Memory& shared = *core_->memory;
  if (tagged && shared.key && !shared.key->tag(memory, mapped)) {
    ::munmap(memory, mapped);
    fail(std::string(kPhase), "allocate: tagging {} bytes with the protection key failed: {}",
         mapped, std::strerror(errno));
  }
  try {
    std::lock_guard lock(shared.mutex);
    shared.add_device_range(memory, mapped, tagged);
  } catch (...) {
    ::munmap(memory, mapped);
    throw;
  }
  return std::shared_ptr<std::byte[]>(
      static_cast<std::byte*>(memory),
      [core = core_, mapped](std::byte* p) { core->release(p, mapped); });
}

SharedMemory SimulatedDevice::allocate_shared(uint64_t bytes) {
  if (!core_->options.shares_memory) return {};
  HostMemory file = HostMemory::memfd(page_rounded(bytes), "proxyep-simulated-device");
  const bool nic = core_->options.nic_reads_device_memory;
  SharedMemory shared;
  shared.handle = encode_shared_handle({.nic_reads = nic,
                                        .pid = static_cast<uint64_t>(::getpid()),
                                        .fd = static_cast<uint64_t>(file.fd()),
                                        .bytes = bytes});
  shared.bytes = bytes;
  shared.fd = file.fd();  // owned by the mapping's owner, which `memory` keeps alive
  shared.memory = adopt_shared(std::move(file), !nic, kPhase);
  shared.nic_reads = shared.registers_as_host = nic;
  return shared;
}

std::shared_ptr<std::byte[]> SimulatedDevice::open_shared(std::span<const uint8_t> handle,
                                                          uint64_t bytes, std::string_view phase) {
  const SimulatedSharedHandle h = read_shared_handle(handle, bytes, "open_shared", phase);
  return adopt_shared(HostMemory::map_process_fd(h.pid, h.fd), true, phase);
}

std::shared_ptr<std::byte[]> SimulatedDevice::adopt_shared(HostMemory file, bool tagged,
                                                           std::string_view phase) {
  Memory& shared = *core_->memory;
  const uint64_t mapped = file.size();
  auto* memory = static_cast<std::byte*>(file.host());
  require(!tagged || !shared.key || shared.key->tag(memory, mapped), phase,
          "tagging {} bytes of shared device memory with the protection key failed: {}", mapped,
          std::strerror(errno));
  {
    std::lock_guard lock(shared.mutex);
    shared.add_device_range(memory, mapped, tagged);  // on failure `file` unmaps it
  }
  auto owner = std::make_shared<HostMemory>(std::move(file));
  return std::shared_ptr<std::byte[]>(memory, [core = core_, mapped, owner](std::byte* p) mutable {
    core->release(p, mapped, [owner = std::move(owner)]() mutable { owner.reset(); });
  });
}

void* SimulatedDevice::register_host(void* host, uint64_t bytes) {
  require(host != nullptr && bytes > 0, kPhase, "register_host: no memory given");
  Memory& shared = *core_->memory;
  std::lock_guard lock(shared.mutex);
  const auto start = reinterpret_cast<uintptr_t>(host);
  auto next = shared.ranges.lower_bound(start);
  const bool overlaps_next = next != shared.ranges.end() && next->first < start + bytes;
  const bool overlaps_previous = next != shared.ranges.begin() &&
                                 std::prev(next)->first + std::prev(next)->second.bytes > start;
  require(!overlaps_next && !overlaps_previous, kPhase,
          "register_host: {} ({} bytes) overlaps memory the device already reaches", host, bytes);
  shared.ranges[start] = {bytes, false};
  return host;
}

void SimulatedDevice::unregister_host(void* host) {
  Memory& shared = *core_->memory;
  std::lock_guard lock(shared.mutex);
  auto it = shared.ranges.find(reinterpret_cast<uintptr_t>(host));
  require(it != shared.ranges.end() && !it->second.device, kPhase,
          "unregister_host: {} was not registered", host);
  shared.ranges.erase(it);
}

void SimulatedDevice::copy(void* to, const void* from, uint64_t bytes) {
  if (bytes == 0) return;
  require(to != nullptr && from != nullptr, kPhase, "copy: null address");
  // Plain host memory is allowed on either side (a staged copy); device memory must be whole.
  auto check_side = [&](const void* p, std::string_view what) {
    const bool reached = core_->reachable(p, 1);
    if (reached) core_->require_reachable("copy", what, p, bytes);
  };
  check_side(to, "destination");
  check_side(from, "source");
  const uint64_t limit = core_->options.max_read_back_bytes;
  require(limit == 0 || bytes <= limit || core_->reachable(to, 1) || !core_->reachable(from, 1),
          kPhase,
          "copy: {} bytes from device memory into plain host memory, more than the {} a "
          "read-back may move here (max_read_back_bytes)",
          bytes, limit);
  if (!core_->reachable(to, 1) || !core_->reachable(from, 1)) {
    std::lock_guard lock(core_->mutex);
    core_->refuse_in_capture(fmt::format("copy: {} bytes {} plain host memory", bytes,
                                         core_->reachable(to, 1) ? "from" : "into"),
                             kPhase);
  }
  core_->enqueue("copy", [to, from, bytes] { std::memmove(to, from, bytes); });
}

void SimulatedDevice::fill(void* to, uint8_t value, uint64_t bytes) {
  if (bytes == 0) return;
  core_->require_reachable("fill", "destination", to, bytes);
  core_->enqueue("fill", [to, value, bytes] { std::memset(to, value, bytes); });
}

namespace {

// The stream's producer of one ring: a host RingProducer that only the stream's worker uses.
struct SimulatedRingProducer final : DeviceRingProducer {
  SimulatedRingProducer(const Ring& attached, const void* on_stream)
      : ring(attached), producer(attached), stream(on_stream) {}
  Ring ring;
  RingProducer producer;
  const void* stream;  // the Core it was attached on
};

}  // namespace

std::unique_ptr<DeviceRingProducer> SimulatedDevice::attach_ring(const Ring& ring) {
  require(ring.producer_mode() == ProducerMode::multi, kPhase,
          "attach_ring: a device pushes into multi-producer rings only (cuda/ring_producer.cuh)");
  core_->require_reachable("attach_ring", "the ring", &ring.header(),
                           Ring::bytes_for(ring.capacity()));
  return std::make_unique<SimulatedRingProducer>(ring, core_.get());
}

void SimulatedDevice::ring_push(DeviceRingProducer& producer, const Descriptor* descriptors,
                                int64_t count, std::chrono::milliseconds timeout) {
  auto* ring = dynamic_cast<SimulatedRingProducer*>(&producer);
  require(ring != nullptr && ring->stream == core_.get(), kPhase,
          "ring_push: the ring was not attached to this stream");
  require(count >= 0, kPhase, "ring_push: {} descriptors", count);
  if (count == 0) return;
  core_->require_reachable("ring_push", "descriptors", descriptors,
                           static_cast<uint64_t>(count) * sizeof(Descriptor));
  core_->enqueue("ring_push", [ring, descriptors, count, timeout] {
    for (int64_t i = 0; i < count; ++i) {
      if (ring->producer.push(descriptors[i], Deadline(timeout)) == Status::ok) continue;
      // As the GPU's producer gives up: the consumer stalls at the position it reserved, and
      // its health() says the producer failed; the rest of the batch is dropped.
      RingHeader& header = ring->ring.header();
      atomic(header.signal.abandoned)
          .store(atomic(header.producer.head).load(std::memory_order_acquire),
                 std::memory_order_release);
      return;
    }
  });
}

}  // namespace proxyep::gpu_side::device
