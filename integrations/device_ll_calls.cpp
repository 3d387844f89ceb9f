// Low-latency calls with device tensors, staged through host memory (device_ll_calls.hpp).
#include "integrations/device_ll_calls.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "integrations/device_staging.hpp"

#include <chrono>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

LowLatencyDispatchResult ll_dispatch_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyDispatchArgs& args) {
  // Every read of the inputs, the routing's copy and the kernels', after previous_event.
  DeviceStaging steering(device, "low_latency_dispatch");
  steering.order_after(args.previous_event);
  const low_latency::LlDeviceCall call{.backend = backend,
                                       .topk_idx = steering.to_host(args.topk_idx)};
  steering.wait();
  return mode.dispatch(args, &call);
}

LowLatencyCombineResult ll_combine_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, CommStream& stream,
    const LowLatencyCombineArgs& args, const ep::Tensor& device_combine_buffer,
    ep::Tensor host_combine_buffer, const HostLlCombine& host_call) {
  auto staging = std::make_shared<DeviceStaging>(device, "low_latency_combine");
  staging->order_after(args.previous_event);
  LowLatencyCombineArgs host = args;
  if (args.zero_copy) {
    require(device_combine_buffer.defined() &&
                device_combine_buffer.bytes() == host_combine_buffer.bytes(),
            "low_latency_combine",
            "zero_copy: write the expert outputs into get_next_low_latency_combine_buffer(handle) "
            "of this handle first");
    device->copy(host_combine_buffer.raw(), device_combine_buffer.raw(),
                 host_combine_buffer.bytes());
  } else {
    host.x = staging->to_host(args.x);
  }
  host.topk_idx = staging->to_host(args.topk_idx);
  host.topk_weights = staging->to_host(args.topk_weights);
  host.out = staging->in_out(args.out);
  host.combine_wait_recv_cost_stats = staging->accumulate(args.combine_wait_recv_cost_stats);
  staging->wait();
  LowLatencyCombineResult result = host_call(host);
  finish_on_device(stream, staging, {staging->move_to_device(result.combined_x)}, result.hook,
                   result.event);
  return result;
}

void ll_query_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                        const ep::TensorRef& out,
                        const std::function<void(const ep::TensorRef&)>& host_query) {
  DeviceStaging staging(device, "low_latency_query_mask_buffer");
  const ep::TensorRef host = staging.in_out(out);
  staging.wait();
  host_query(host);
  staging.write_back();
  staging.wait();
}

ep::Tensor DeviceCombineBuffer::get(gpu_side::device::DeviceRuntime& device,
                                    const ep::Tensor& host_buffer) {
  if (buffer_.rows() == host_buffer.rows() && buffer_.cols() == host_buffer.cols()) return buffer_;
  buffer_ = ep::Tensor::over(device.allocate(host_buffer.bytes()), host_buffer.dtype(),
                             host_buffer.rows(), host_buffer.cols(), ep::Device::cuda);
  // Zeroed, as the host buffer is, before the caller's own stream may write into it.
  device.fill(buffer_.raw(), 0, buffer_.bytes());
  device.synchronize("get_next_low_latency_combine_buffer",
                     std::chrono::milliseconds(params::ep_timeout_ms.get()));
  return buffer_;
}

}  // namespace proxyep::integrations
