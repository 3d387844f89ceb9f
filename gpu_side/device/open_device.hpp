// A DeviceRuntime chosen by name, for the front ends that let a user choose where tensors live:
// `proxyep bench ep --device` and the Python module's Device (python/src/device_binding.cpp).
//   "host"       none: host tensors, the CPU backend (a null runtime)
//   "simulated"  the host-simulated device (simulated_device.hpp), standing for a GPU whose
//                memory the NIC reads (GPUDirect RDMA): it runs the device path end to end and
//                checks its addresses; its times are of host threads, not of a GPU
//   "cuda"       the GPU of local rank N: N modulo the devices visible (CudaDevice); only in a
//                build with CUDA (the library proxyep_devices then links the kernels)
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::device {

// The names open_device() takes.
const std::vector<std::string>& device_kinds();

// Whether this build has the CUDA device (a GPU is still needed to open one).
bool built_with_cuda();

// Null for "host". Throws proxyep::Error(phase) for an unknown kind, and for "cuda" in a build
// without CUDA or on a machine without a usable GPU.
std::shared_ptr<DeviceRuntime> open_device(std::string_view kind, int local_rank,
                                           std::string_view phase);

// The point a stream of the caller's has reached (a cudaStream_t, e.g. torch's current stream;
// 0 is CUDA's legacy default stream), for `device` to wait_event() on: what orders a Buffer's
// stream after the caller's work (DeepEP's comm stream waiting for the compute stream), and a
// device tensor's release after the caller's reads of it. Null for a runtime that has no streams
// of the caller's to order after (the simulated device: its callers' work is on the host, done
// when they call).
// While that stream captures a CUDA graph: with `join_capture` the event is a point inside the
// capture (a Buffer's stream waiting for it joins the capture: the low-latency calls, which can
// be captured); else throws proxyep::Error(phase) (see require_no_graph_capture).
std::shared_ptr<DeviceEvent> record_on_caller_stream(DeviceRuntime& device, uintptr_t stream,
                                                     std::string_view phase,
                                                     bool join_capture = false);

// Makes a stream of the caller's (as above) wait for `event` of `device` (cudaStreamWaitEvent:
// queued, the host does not wait) and returns true; false for a runtime without streams of the
// caller's (the simulated device), whose caller waits on the host instead. What a DeepEP
// EventHandle's current_stream_wait() does with an async call's device point.
bool caller_stream_wait(DeviceRuntime& device, uintptr_t stream,
                        const std::shared_ptr<DeviceEvent>& event, std::string_view phase);

// Throws proxyep::Error(phase) when `stream` (a cudaStream_t of the caller's, for a CUDA
// `device`) is capturing a CUDA graph: a Buffer call other than the low-latency ones (on one
// node) waits on the host (its routing, its receive), so it cannot be captured, and letting it
// run would leave it out of the graph. Nothing for a device without CUDA streams.
void require_no_graph_capture(DeviceRuntime& device, uintptr_t stream, std::string_view phase);

// The cudaStream_t `device`'s work runs on (a CudaDevice's), or 0 for a runtime whose stream
// is no CUDA stream (the simulated device).
uintptr_t cuda_stream_of(DeviceRuntime& device);

// The CUDA device holding memory at `address` (device memory, or managed memory), or -1 for
// memory CUDA does not place on a device: host memory, the simulated device's, or any memory in
// a build without CUDA or on a machine without a GPU. For whoever must say where a device
// tensor lives (DLPack's device of an output).
int cuda_device_of(const void* address);

}  // namespace proxyep::gpu_side::device
