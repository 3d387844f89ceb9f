// Moving whole tensors between host memory and a DeviceRuntime's memory, waiting for the copy:
// for callers that stage inputs and read back outputs outside the timed or protocol paths
// (benchmarks, tests). The Buffer itself never does this: its device calls stay on the device.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <chrono>
#include <string_view>

namespace proxyep::gpu_side::device {

// A device tensor holding `host`'s bytes, shape and dtype (undefined stays undefined). Throws
// proxyep::Error(phase) when the copy fails or outlasts `timeout`.
inline ep::Tensor to_device(DeviceRuntime& device, const ep::Tensor& host, std::string_view phase,
                            std::chrono::milliseconds timeout) {
  if (!host.defined()) return {};
  ep::Tensor t = ep::Tensor::over(device.allocate(host.bytes()), host.dtype(), host.rows(),
                                  host.dims() == 1 ? -1 : host.cols(), ep::Device::cuda);
  device.copy(t.raw(), host.raw(), host.bytes());
  device.synchronize(phase, timeout);
  return t;
}

// A host copy of device tensor `t` (undefined stays undefined).
inline ep::Tensor to_host(DeviceRuntime& device, const ep::Tensor& t, std::string_view phase,
                          std::chrono::milliseconds timeout) {
  if (!t.defined()) return {};
  require(t.device() == ep::Device::cuda, phase, "to_host: the tensor is not device memory");
  ep::Tensor host = t.dims() == 1 ? ep::Tensor::empty(t.dtype(), t.rows())
                                  : ep::Tensor::empty(t.dtype(), t.rows(), t.cols());
  device.copy(host.raw(), t.raw(), t.bytes());
  device.synchronize(phase, timeout);
  return host;
}

}  // namespace proxyep::gpu_side::device
