// Tensors across the Python boundary, without copies.
//
// In: proxyep/_tensors.py turns a torch tensor into a view spec, the tuple
// (data_ptr, dtype name, shape, strides, on_device) with strides in elements, or None; view_of()
// makes a TensorRef over the same memory (1-D or 2-D: the Python side flattens leading
// dimensions first), device memory when on_device (a CUDA tensor, or a tensor over the simulated
// device's memory). The torch tensor must stay alive for the call, which the Python caller
// guarantees by holding it.
//
// Out: capsule_of() hands a runtime Tensor to torch as a DLPack capsule ("dltensor") whose
// manager keeps the Tensor's storage alive until torch frees the tensor, so outputs are torch
// tensors over the memory the runtime filled. A device Tensor in CUDA memory becomes a CUDA
// tensor of its GPU (DLPack's kDLCUDA); the simulated device's memory is host memory (kDLCPU).
// Device memory is released on its runtime's stream; given a DeviceRelease, once the caller's
// stream has passed the point it had reached when torch freed the tensor, so that kernels the
// caller queued on its own stream (torch's current stream) and that read the tensor have run
// first: the storage waits in the Buffer's DeviceReleases (integrations/device_releases.hpp),
// never as a wait queued on the Buffer's stream. DLPack in torch 1.13
// has no bool and no FP8: bool and e4m3 tensors travel as uint8 and the Python side views them back
// (bool) or keeps uint8 (e4m3 bytes, documented). capsule_of_bytes() lends torch raw runtime memory
// (the Buffer's arena) instead, kept valid by holding its owner.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/device_releases.hpp"

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace proxyep::python {

// Whose stream a device output's release waits for: `caller_stream` (a cudaStream_t; 0 = the
// legacy default stream) as `device` sees it (open_device.hpp: record_on_caller_stream).
struct DeviceRelease {
  std::shared_ptr<gpu_side::device::DeviceRuntime> device;
  uintptr_t caller_stream = 0;
  std::shared_ptr<integrations::DeviceReleases> releases;  // where the storage waits
};

gpu_side::ep::TensorRef view_of(const pybind11::handle& spec, std::string_view name);
// The view spec of `t` (None when undefined): what view_of() reads back into the same TensorRef,
// so that an argument class's tensor attributes read back what they were set to.
pybind11::object spec_of(const gpu_side::ep::TensorRef& t);
pybind11::object capsule_of(const gpu_side::ep::Tensor& tensor,
                            const DeviceRelease* release = nullptr);
// A uint8 capsule over memory the runtime owns elsewhere; `owner` (the Python object whose life
// keeps `bytes` valid) is held until torch frees the tensor.
pybind11::object capsule_of_bytes(std::span<std::byte> bytes, pybind11::object owner);

}  // namespace proxyep::python
