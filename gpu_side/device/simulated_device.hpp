// SimulatedDevice: the DeviceRuntime (device_runtime.hpp) with the host standing in for the GPU,
// so the backend code above the interface runs in CI exactly as it runs on CUDA.
//
// What it simulates, and so what a test on it catches:
// - Device memory is separate: page-aligned mappings tagged with a memory protection key
//   (thread_access_key.hpp) that only the stream's thread may touch. Host code that reads or
//   writes a device address faults at once. Without pkeys (this project's CI) the memory is
//   closed in time instead (simulated_device_core.hpp, Memory): PROT_NONE while none of the
//   device's streams runs an operation, so host code that touches it faults unless the device
//   happens to be busy at that moment (after a synchronize, always).
//   device_memory_protected() says whether either holds (protect_device_memory turns both off).
// - Reachability: every address an operation is given, and every address inside the tables it
//   points to (sink arrays, combine's per-rank rows), must lie in device memory or registered
//   host memory, for the whole extent the operation touches. A plain host pointer handed to a
//   kernel is refused naming the operation and the argument.
// - The stream is asynchronous: one worker thread runs the queued operations in order;
//   another_stream() gives a second stream of the same device, ordered only through events. With
//   defer_until_synchronize nothing runs until the host waits (synchronize(), wait_for()), and
//   then only what was queued before the wait began, so a host that reads a result (in
//   registered host memory) before waiting reads stale bytes and its test fails. synchronize()
//   waits, as cudaStreamSynchronize, for the work queued before it, not for what other threads
//   queue meanwhile.
// - Capture: between begin_capture and end_capture nothing runs (the operations are recorded),
//   and a host wait, a wait_event for a point outside the capture or a copy with plain host
//   memory is refused and invalidates the capture, as CUDA's would be: code meant to be
//   captured that still needs the host fails here, without a GPU. Another stream joins a
//   capture by wait_event for a point recorded inside it, and must be joined back (the
//   capturing stream waits for a point after its last operation) before end_capture, as on
//   CUDA; the graph runs the joined streams' operations on the launching stream, in the order
//   they were queued.
// - Kernels are the CPU twins of the CUDA kernels: the same per-row and per-token rules
//   (gpu_side/ep/layout_rules.hpp, row_rules.hpp), so results are bit-identical to the GPU's.
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/device/device_runtime.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace proxyep::gpu_side::device {

struct SimulatedDeviceOptions {
  // An event recorded on a deferred stream is reached only when that stream is synchronized.
  bool defer_until_synchronize = false;
  bool protect_device_memory = true;  // protection keys where there are, else the gate...
  bool gate_without_keys = true;      // ... unless this is off
  // Each operation starts this late: a slow stream, so that work another stream does not wait
  // for (with wait_event) visibly races it.
  std::chrono::milliseconds operation_delay{0};
  // Stands for a GPU whose memory a NIC reads directly: allocate_for_nic() gives device memory
  // (reachable by kernels, counted as device bytes) without the protection key, so that the
  // proxy threads, which stand for the NIC, may read it; registered with the fabric as host
  // memory. Off: allocate_for_nic() offers none.
  bool nic_reads_device_memory = false;
  // A device fault on demand: the `fail_at`-th operation named `fail_operation` ("ring_push",
  // "copy", ...; 1 = the first) fails instead of running, and the stream with it (sticky, as a
  // CUDA context's fault): what callers see when a GPU faults mid-call. Empty: never.
  std::string fail_operation;
  uint64_t fail_at = 1;
  // The most bytes one copy() may move from device memory into plain host memory (0: no limit);
  // a larger one is refused at once, naming its size: a stand-in for calls that must not read
  // a tensor back to the host (what a CUDA graph could not capture), only a few counts.
  uint64_t max_read_back_bytes = 0;
  // Off: allocate_shared() offers none, as a GPU without CUDA IPC (or a device that cannot share
  // memory) would: the node peers' arenas stay host memory, and what needs shared device memory
  // (captured LL calls) is refused.
  bool shares_memory = true;
};

class SimulatedDevice final : public DeviceRuntime {
 public:
  explicit SimulatedDevice(SimulatedDeviceOptions options = {});
  // Runs what is queued, then stops the stream; memory still owned elsewhere stays valid and is
  // released directly when dropped.
  ~SimulatedDevice() override;
  SimulatedDevice(const SimulatedDevice&) = delete;
  SimulatedDevice& operator=(const SimulatedDevice&) = delete;

  // Another stream of this device, as a second cudaStream_t: the same memory (its thread may
  // touch it too; device_bytes_in_use counts both), its own queue, ordered with this one only
  // through events (record / wait_event).
  std::shared_ptr<SimulatedDevice> another_stream(SimulatedDeviceOptions options = {}) const;

  bool device_memory_protected() const;
  uint64_t device_bytes_in_use() const;  // allocated and not yet released
  uint64_t operations_run() const;       // by the stream, since construction

  std::string_view kind() const override { return "simulated"; }
  // another_stream() with the default options.
  std::shared_ptr<DeviceRuntime> open_stream() const override { return another_stream(); }
  std::shared_ptr<std::byte[]> allocate(uint64_t bytes) override;
  NicMemory allocate_for_nic(uint64_t bytes) override;
  // A memfd mapped and tagged as device memory; its handle names this process and the fd, so a
  // peer (another device, in this process or another on the machine) maps the same pages at an
  // address of its own, reachable by its stream only. With nic_reads_device_memory this
  // device's own mapping is left untagged (the proxy threads, standing for the NIC, write it).
  SharedMemory allocate_shared(uint64_t bytes) override;
  std::shared_ptr<std::byte[]> open_shared(std::span<const uint8_t> handle, uint64_t bytes,
                                           std::string_view phase) override;
  // The NIC's view of a simulated device's shared memory in a process without that device (the
  // node daemon, which registers it with its fabric for the owner's writes): `fd` (the owner's
  // SharedMemory::fd, passed over a Unix socket) mapped untagged, as a NIC reaches GPU memory
  // by DMA. Only for memory whose handle says a NIC reads it (nic_reads_device_memory).
  // Throws proxyep::Error(phase) for a handle of another kind, one that does not allow it, or
  // fewer than `bytes` behind the descriptor.
  static NicMemory open_for_nic(std::span<const uint8_t> handle, int fd, uint64_t bytes,
                                std::string_view phase);
  void* register_host(void* host, uint64_t bytes) override;
  void unregister_host(void* host) override;
  void copy(void* to, const void* from, uint64_t bytes) override;
  void fill(void* to, uint8_t value, uint64_t bytes) override;
  // Its table (simulated_kernels.hpp) with itself.
  BoundKernels kernels() override;
  std::unique_ptr<DeviceRingProducer> attach_ring(const Ring& ring) override;
  void ring_push(DeviceRingProducer& producer, const Descriptor* descriptors, int64_t count,
                 std::chrono::milliseconds timeout) override;
  // wait_value polls the word from the stream's thread (a short spin, then 20 us sleeps).
  void wait_value(const uint64_t* word, SignalValue value, std::chrono::milliseconds timeout,
                  std::string_view phase, int64_t* waited_ns = nullptr) override;
  void write_value(uint64_t* word, SignalValue value, std::string_view phase) override;
  void add_value(uint64_t* word, uint64_t delta, std::string_view phase) override;
  void begin_capture(std::string_view phase) override;
  std::unique_ptr<DeviceGraph> end_capture(std::string_view phase) override;
  void launch(const DeviceGraph& graph, std::string_view phase) override;
  bool capturing() const override;
  std::shared_ptr<DeviceEvent> record() override;
  void wait_event(const std::shared_ptr<DeviceEvent>& event,
                  std::chrono::milliseconds timeout) override;
  bool reached(const DeviceEvent& event, std::string_view phase) override;
  void wait_for(const DeviceEvent& event, std::string_view phase,
                std::chrono::milliseconds timeout) override;
  void synchronize(std::string_view phase, std::chrono::milliseconds timeout) override;

  struct Core;  // one stream; shared with allocations, which may outlive the device
  // The stream, for the kernels' table (simulated_kernels.cpp).
  Core& core() const;
  struct Memory;  // what the streams of a device share
  struct Event;
  struct Graph;

 private:
  SimulatedDevice(std::shared_ptr<Memory> memory, SimulatedDeviceOptions options);
  void join_capture(const Event& event);  // wait_event for a point inside a capture
  // Device memory; `tagged`: with the protection key (only the stream's thread may touch it).
  std::shared_ptr<std::byte[]> allocate_mapped(uint64_t bytes, bool tagged);
  // Makes `file`'s mapping this device's memory (tagged when `tagged`) and owns it until the
  // last owner drops it.
  std::shared_ptr<std::byte[]> adopt_shared(HostMemory file, bool tagged, std::string_view phase);
  std::shared_ptr<Core> core_;
};

}  // namespace proxyep::gpu_side::device
