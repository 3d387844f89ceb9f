// CudaDevice: the DeviceRuntime (gpu_side/device/device_runtime.hpp) on a CUDA GPU. One
// non-blocking stream per device object (the backend's communication stream), stream-ordered
// allocation (cudaMallocAsync / cudaFreeAsync), host memory registered mapped, and the kernels
// of ep_kernels.hpp. Errors become proxyep::Error naming the operation; a fault inside a kernel
// surfaces at synchronize(), as CUDA reports it.
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <memory>

namespace proxyep::gpu_side::cuda {

class CudaDevice final : public device::DeviceRuntime {
 public:
  // On `ordinal`, or the current device when -1. Throws proxyep::Error when no device is usable.
  explicit CudaDevice(int ordinal = -1);
  ~CudaDevice() override;  // synchronizes its stream (errors are logged)
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const;
  // The cudaStream_t the operations run on, for callers that order their own work after it.
  void* stream() const;

  std::string_view kind() const override { return "cuda"; }
  // A CudaDevice of the same ordinal: its own non-blocking stream.
  std::shared_ptr<device::DeviceRuntime> open_stream() const override;
  std::shared_ptr<std::byte[]> allocate(uint64_t bytes) override;
  // cudaMalloc, not the stream-ordered pool: pool memory may not be registrable for GPUDirect
  // RDMA (FI_HMEM_CUDA), plain allocations are.
  device::NicMemory allocate_for_nic(uint64_t bytes) override;
  // cudaMalloc + CUDA IPC (cuda_ipc.hpp): a node peer's arena.
  device::SharedMemory allocate_shared(uint64_t bytes) override;
  std::shared_ptr<std::byte[]> open_shared(std::span<const uint8_t> handle, uint64_t bytes,
                                           std::string_view phase) override;
  void* register_host(void* host, uint64_t bytes) override;
  void unregister_host(void* host) override;
  void copy(void* to, const void* from, uint64_t bytes) override;
  void fill(void* to, uint8_t value, uint64_t bytes) override;
  // Its table (cuda_kernels.hpp: the kernels of this folder) with itself.
  device::BoundKernels kernels() override;
  std::unique_ptr<device::DeviceRingProducer> attach_ring(const Ring& ring) override;
  void ring_push(device::DeviceRingProducer& producer, const Descriptor* descriptors, int64_t count,
                 std::chrono::milliseconds timeout) override;
  // wait_value: a one-thread kernel polling the word, its deadline kept by the GPU
  // (stream_signal.hpp); the first failed wait is what reached(), wait_for() and synchronize()
  // report from then on.
  void wait_value(const uint64_t* word, device::SignalValue value,
                  std::chrono::milliseconds timeout, std::string_view phase,
                  int64_t* waited_ns = nullptr) override;
  void write_value(uint64_t* word, device::SignalValue value, std::string_view phase) override;
  void add_value(uint64_t* word, uint64_t delta, std::string_view phase) override;
  // Capture in the thread-local mode (cudaStreamBeginCapture); graphs instantiated with
  // cudaGraphInstantiateFlagAutoFreeOnLaunch.
  void begin_capture(std::string_view phase) override;
  std::unique_ptr<device::DeviceGraph> end_capture(std::string_view phase) override;
  void launch(const device::DeviceGraph& graph, std::string_view phase) override;
  bool capturing() const override;
  std::shared_ptr<void> relax_capture() override;
  std::shared_ptr<device::DeviceEvent> record() override;
  void wait_event(const std::shared_ptr<device::DeviceEvent>& event,
                  std::chrono::milliseconds timeout) override;
  bool reached(const device::DeviceEvent& event, std::string_view phase) override;
  void wait_for(const device::DeviceEvent& event, std::string_view phase,
                std::chrono::milliseconds timeout) override;
  // An event at the current end of a stream of the caller's on this device (a cudaStream_t,
  // e.g. torch.cuda.current_stream().cuda_stream; nullptr is the legacy default stream): what
  // a call's previous_event is made from. Recorded while that stream captures (torch.cuda.graph),
  // it is a point inside the capture: this device's stream waiting for it joins the capture.
  std::shared_ptr<device::DeviceEvent> record_on(void* caller_stream);
  // Makes such a stream of the caller's wait for `event` (cudaStreamWaitEvent), recorded on this
  // device. Throws proxyep::Error(phase) for an event of another device.
  void wait_on(void* caller_stream, const std::shared_ptr<device::DeviceEvent>& event,
               std::string_view phase);
  void synchronize(std::string_view phase, std::chrono::milliseconds timeout) override;

 private:
  struct State;  // shared with allocations, which free on the stream after the device is gone
  std::shared_ptr<State> state_;
};

}  // namespace proxyep::gpu_side::cuda
