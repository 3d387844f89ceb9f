// Moving test tensors to and from a DeviceRuntime, for the Buffer tests with device tensors
// (device_buffer_case.hpp, device_ll_case.hpp), which run on the host-simulated device in CI and
// on CUDA in tests/gpu.
#pragma once

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/device/tensor_transfer.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/low_latency_types.hpp"

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

namespace proxyep::integrations::testing {

namespace ep = gpu_side::ep;

// A rank's device: the stream its Buffer works on, and another stream of the same device standing
// for the caller's compute stream, where a test makes some inputs (a slow one on the simulated
// device, so that a call that does not wait for its previous_event reads stale inputs).
struct RankDevice {
  std::shared_ptr<gpu_side::device::DeviceRuntime> buffer, caller;
};
using DeviceFactory = std::function<RankDevice(int rank)>;

inline constexpr auto kWait = std::chrono::seconds(20);

inline ep::Tensor upload(gpu_side::device::DeviceRuntime& device, const ep::Tensor& host) {
  return gpu_side::device::to_device(device, host, "test upload", kWait);
}

// `host`'s bytes in device memory as `stream` writes them, not waited for: the output of a kernel
// of the caller's. `host` must stay alive until `stream` is synchronized.
inline ep::Tensor produce_on(gpu_side::device::DeviceRuntime& stream, const ep::Tensor& host) {
  ep::Tensor t = ep::Tensor::over(stream.allocate(host.bytes()), host.dtype(), host.rows(),
                                  host.dims() == 1 ? -1 : host.cols(), ep::Device::cuda);
  stream.copy(t.raw(), host.raw(), host.bytes());
  return t;
}

inline ep::Tensor download(gpu_side::device::DeviceRuntime& device, const ep::Tensor& t,
                           const std::string& what) {
  require(t.defined() && t.device() == ep::Device::cuda, "test", "{} is not a device tensor", what);
  return gpu_side::device::to_host(device, t, "test download", kWait);
}

// How a caller waits for an async_finish call with device tensors, as ep.async_wait says: its
// stream at the call's device point (device; as DeepEP's EventOverlap::current_stream_wait() on
// a GPU), or the host for the call (host, the default: the outputs are then complete on every
// stream). Checks that the call has a device point exactly when it should.
inline void caller_waits_for(gpu_side::device::DeviceRuntime& caller, const CallEvent& event,
                             const std::string& what) {
  const bool device_points = params::ep_async_wait.get() == "device";
  require((event.device_point() != nullptr) == device_points, "test",
          "an async_finish {} with device tensors {} a device point (ep.async_wait = {})", what,
          device_points ? "has no" : "has", params::ep_async_wait.get());
  if (device_points)
    caller.wait_event(event.device_point(), kWait);
  else
    event.wait();
}

inline void require_equal(gpu_side::device::DeviceRuntime& device, const ep::Tensor& got,
                          const ep::Tensor& want, int64_t rows, const std::string& what) {
  const ep::Tensor host = download(device, got, what);
  const size_t bytes = static_cast<size_t>(rows) * want.bytes() / static_cast<size_t>(want.rows());
  require(host.rows() >= rows && std::memcmp(host.raw(), want.raw(), bytes) == 0, "test",
          "{} differs from the reference", what);
}

// The message of the proxyep::Error `call` throws ("" when it does not).
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline void require_mentions(const std::string& error, const std::string& words) {
  require(error.find(words) != std::string::npos, "test", "expected an error saying '{}'; got '{}'",
          words, error);
}

// A device LL dispatch's outputs and handle tensors as host tensors, read through `device` (a
// stream that is past the call's device work).
inline LowLatencyDispatchResult dispatch_on_host(gpu_side::device::DeviceRuntime& device,
                                                 const LowLatencyDispatchResult& d) {
  require(d.handle.src_info.device() == ep::Device::cuda &&
              d.handle.layout_range.device() == ep::Device::cuda,
          "test", "a device dispatch's handle holds host tensors");
  LowLatencyDispatchResult h = d;
  h.recv_x = download(device, d.recv_x, "recv_x");
  h.recv_x_scales = download(device, d.recv_x_scales, "recv_x_scales");
  h.recv_count = download(device, d.recv_count, "recv_count");
  h.handle.src_info = download(device, d.handle.src_info, "src_info");
  h.handle.layout_range = download(device, d.handle.layout_range, "layout_range");
  return h;
}

}  // namespace proxyep::integrations::testing
