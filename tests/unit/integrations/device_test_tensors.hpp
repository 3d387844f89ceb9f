// Moving test tensors to and from a DeviceRuntime, for the Buffer tests with device tensors
// (device_buffer_case.hpp, device_ll_case.hpp), which run on the host-simulated device in CI and
// on CUDA in tests/gpu.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

namespace proxyep::integrations::testing {

namespace ep = gpu_side::ep;

// The device of rank `rank` of a test.
using DeviceFactory = std::function<std::shared_ptr<gpu_side::device::DeviceRuntime>(int rank)>;

inline constexpr auto kWait = std::chrono::seconds(20);

inline ep::Tensor upload(gpu_side::device::DeviceRuntime& device, const ep::Tensor& host) {
  ep::Tensor t = ep::Tensor::over(device.allocate(host.bytes()), host.dtype(), host.rows(),
                                  host.dims() == 1 ? -1 : host.cols(), ep::Device::cuda);
  device.copy(t.raw(), host.raw(), host.bytes());
  device.synchronize("test upload", kWait);
  return t;
}

inline ep::Tensor download(gpu_side::device::DeviceRuntime& device, const ep::Tensor& t,
                           const std::string& what) {
  require(t.defined() && t.device() == ep::Device::cuda, "test", "{} is not a device tensor", what);
  ep::Tensor host = t.dims() == 1 ? ep::Tensor::empty(t.dtype(), t.rows())
                                  : ep::Tensor::empty(t.dtype(), t.rows(), t.cols());
  device.copy(host.raw(), t.raw(), t.bytes());
  device.synchronize("test download", kWait);
  return host;
}

inline void require_equal(gpu_side::device::DeviceRuntime& device, const ep::Tensor& got,
                          const ep::Tensor& want, int64_t rows, const std::string& what) {
  const ep::Tensor host = download(device, got, what);
  const size_t bytes = static_cast<size_t>(rows) * want.bytes() / static_cast<size_t>(want.rows());
  require(host.rows() >= rows && std::memcmp(host.raw(), want.raw(), bytes) == 0, "test",
          "{} differs from the reference", what);
}

}  // namespace proxyep::integrations::testing
