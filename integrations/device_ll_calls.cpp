// Low-latency calls with device tensors on the device backend (device_ll_calls.hpp).
#include "integrations/device_ll_calls.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/device_table.hpp"
#include "integrations/device_steering.hpp"

#include <chrono>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

LowLatencyDispatchResult ll_dispatch_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyDispatchArgs& args) {
  // Every read of the inputs (the routing's, the kernels') after previous_event.
  order_after(*device, args.previous_event, "low_latency_dispatch");
  const low_latency::LlDeviceCall call{.backend = backend, .combine_buffer = {}};
  return mode.dispatch(args, &call);
}

LowLatencyCombineResult ll_combine_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyCombineArgs& args,
    const ep::TensorRef& combine_buffer) {
  order_after(*device, args.previous_event, "low_latency_combine");
  const low_latency::LlDeviceCall call{.backend = backend, .combine_buffer = combine_buffer};
  return mode.combine(args, &call);
}

ep::Tensor DeviceCombineBuffer::get(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                    std::pair<int64_t, int64_t> shape) {
  const auto [rows, cols] = shape;
  if (buffer_.rows() == rows && buffer_.cols() == cols) return buffer_;
  // Relaxed: a capture in CUDA's global mode (torch's) the Buffer's stream has not joined yet
  // would refuse the allocation from this thread.
  const std::shared_ptr<void> relaxed = device->relax_capture();
  const gpu_side::device::SetupStream setup = gpu_side::device::setup_stream(device);
  buffer_ = ep::Tensor::over(setup->allocate(2ull * static_cast<uint64_t>(rows * cols)),
                             ep::DType::bf16, rows, cols, ep::Device::cuda);
  // Zeroed, as the host buffer is, before the caller's own stream may write into it.
  setup->fill(buffer_.raw(), 0, buffer_.bytes());
  setup->synchronize("get_next_low_latency_combine_buffer",
                     std::chrono::milliseconds(params::ep_timeout_ms.get()));
  return buffer_;
}

}  // namespace proxyep::integrations
