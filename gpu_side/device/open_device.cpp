// A DeviceRuntime chosen by name (open_device.hpp).
#include "gpu_side/device/open_device.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/simulated_device.hpp"

#if PROXYEP_HAVE_CUDA
#include "gpu_side/cuda/cuda_device.hpp"

#include <cuda_runtime_api.h>
#endif

namespace proxyep::gpu_side::device {

const std::vector<std::string>& device_kinds() {
  static const std::vector<std::string> kinds = {"host", "simulated", "cuda"};
  return kinds;
}

bool built_with_cuda() {
#if PROXYEP_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::shared_ptr<DeviceRuntime> open_device(std::string_view kind, int local_rank,
                                           std::string_view phase) {
  if (kind == "host") return nullptr;
  // As a GPU with GPUDirect RDMA (every cudaMalloc'ed GPU beside an EFA NIC): where the fabric
  // registers device memory (shm in a CUDA build), chunks leave from device memory and rows land
  // in it.
  if (kind == "simulated") {
    SimulatedDeviceOptions options;
    options.nic_reads_device_memory = true;
    options.gate_without_keys = params::device_simulated_gate.get();
    return std::make_shared<SimulatedDevice>(options);
  }
  require(kind == "cuda", phase, "device {}: not one of host, simulated, cuda", kind);
  require(local_rank >= 0, phase, "device cuda: local rank {} is negative", local_rank);
#if PROXYEP_HAVE_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  require(status == cudaSuccess && count > 0, phase, "device cuda: no usable CUDA device ({})",
          status == cudaSuccess ? "none found" : cudaGetErrorString(status));
  return std::make_shared<cuda::CudaDevice>(local_rank % count);
#else
  fail(std::string(phase), "device cuda: this build has no CUDA (nvcc was not found)");
#endif
}

std::shared_ptr<DeviceEvent> record_on_caller_stream(DeviceRuntime& device, uintptr_t stream,
                                                     std::string_view phase, bool join_capture) {
#if PROXYEP_HAVE_CUDA
  if (auto* cuda = dynamic_cast<cuda::CudaDevice*>(&device)) {
    if (!join_capture) require_no_graph_capture(device, stream, phase);
    return cuda->record_on(reinterpret_cast<void*>(stream));
  }
#else
  (void)device, (void)stream, (void)phase, (void)join_capture;
#endif
  return nullptr;
}

bool caller_stream_wait(DeviceRuntime& device, uintptr_t stream,
                        const std::shared_ptr<DeviceEvent>& event, std::string_view phase) {
#if PROXYEP_HAVE_CUDA
  if (auto* cuda = dynamic_cast<cuda::CudaDevice*>(&device)) {
    cuda->wait_on(reinterpret_cast<void*>(stream), event, phase);
    return true;
  }
#else
  (void)device, (void)stream, (void)event, (void)phase;
#endif
  return false;
}

void require_no_graph_capture(DeviceRuntime& device, uintptr_t stream, std::string_view phase) {
#if PROXYEP_HAVE_CUDA
  if (dynamic_cast<cuda::CudaDevice*>(&device) == nullptr) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t status =
      cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture);
  (void)cudaGetLastError();  // not sticky; leave nothing for the next check to find
  // The legacy default stream cannot even be asked while another stream captures globally.
  const bool capturing = status == cudaErrorStreamCaptureImplicit ||
                         (status == cudaSuccess && capture != cudaStreamCaptureStatusNone);
  require(!capturing, phase,
          "the caller's stream is capturing a CUDA graph: only the low-latency calls on one node "
          "can be captured; this call waits on the host (the routing, the receive), so make it "
          "outside graph capture (e.g. SGLang's --disable-cuda-graph, vLLM's "
          "enforce_eager=True)");
#else
  (void)device, (void)stream, (void)phase;
#endif
}

uintptr_t cuda_stream_of(DeviceRuntime& device) {
#if PROXYEP_HAVE_CUDA
  if (auto* cuda = dynamic_cast<cuda::CudaDevice*>(&device))
    return reinterpret_cast<uintptr_t>(cuda->stream());
#else
  (void)device;
#endif
  return 0;
}

int cuda_device_of(const void* address) {
#if PROXYEP_HAVE_CUDA
  // Without a usable driver every query fails the same way: asked once.
  static const bool usable = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  if (!usable || address == nullptr) return -1;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but leave nothing for the next check to find
    return -1;
  }
  const bool on_device =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return on_device ? attributes.device : -1;
#else
  (void)address;
  return -1;
#endif
}

}  // namespace proxyep::gpu_side::device
