// Normal-mode calls with device tensors, staged through host memory (device_calls.hpp).
#include "integrations/device_calls.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <chrono>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

namespace {

// Host copies of a call's device inputs and device copies of its host outputs, moved on the
// device's stream; the host buffers live until the call returns.
class Staging {
 public:
  Staging(gpu_side::device::DeviceRuntime& device, std::string_view phase)
      : device_(device), phase_(phase) {}

  // A host view of `t` with its shape and strides, valid after wait(). Copies the span the
  // strides cover (column-major scales included).
  ep::TensorRef to_host(const ep::TensorRef& t) {
    if (!t.defined()) return t;
    int64_t extent = 0;
    if (t.numel() > 0)
      extent = (t.rows - 1) * t.row_stride + (t.dims == 2 ? (t.cols - 1) * t.col_stride : 0) + 1;
    require(extent >= 0 && t.row_stride >= 0 && t.col_stride >= 0, phase_,
            "device tensors with negative strides are not supported; got {}", t);
    ep::Tensor host = ep::Tensor::empty(t.dtype, extent);
    device_.copy(host.raw(), t.data, host.bytes());
    ep::TensorRef view = t;
    view.data = host.raw();
    view.device = ep::Device::host;
    held_.push_back(std::move(host));
    return view;
  }

  // A device tensor with `host`'s bytes (undefined stays undefined), valid after wait().
  ep::Tensor to_device(const ep::Tensor& host) {
    if (!host.defined()) return {};
    const uint64_t bytes = host.bytes();
    ep::Tensor t = ep::Tensor::over(device_.allocate(bytes), host.dtype(), host.rows(),
                                    host.dims() == 1 ? -1 : host.cols(), ep::Device::cuda);
    device_.copy(t.raw(), host.raw(), bytes);
    held_.push_back(host);
    return t;
  }

  void wait() {
    device_.synchronize(phase_, std::chrono::milliseconds(params::ep_timeout_ms.get()));
  }

 private:
  gpu_side::device::DeviceRuntime& device_;
  std::string_view phase_;
  std::vector<ep::Tensor> held_;
};

}  // namespace

bool tensors_on_device(std::string_view phase, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& t : tensors) {
    if (!t.tensor.defined()) continue;
    if (first == nullptr) {
      first = &t;
      continue;
    }
    require(t.tensor.device == first->tensor.device, phase,
            "{} is in {} memory but {} is in {} memory: a call's tensors must all be on one device",
            t.name, t.tensor.device == ep::Device::cuda ? "device" : "host", first->name,
            first->tensor.device == ep::Device::cuda ? "device" : "host");
  }
  return first != nullptr && first->tensor.device == ep::Device::cuda;
}

DispatchResult dispatch_on_device(gpu_side::device::DeviceRuntime& device, const DispatchArgs& args,
                                  const HostDispatch& host_call) {
  Staging staging(device, "dispatch");
  DispatchArgs host = args;
  host.x = staging.to_host(args.x);
  host.x_scales = staging.to_host(args.x_scales);
  host.num_tokens_per_rank = staging.to_host(args.num_tokens_per_rank);
  host.num_tokens_per_rdma_rank = staging.to_host(args.num_tokens_per_rdma_rank);
  host.is_token_in_rank = staging.to_host(args.is_token_in_rank);
  host.num_tokens_per_expert = staging.to_host(args.num_tokens_per_expert);
  host.topk_idx = staging.to_host(args.topk_idx);
  host.topk_weights = staging.to_host(args.topk_weights);
  // Outputs are copied to the device once the rows are in: the call must be complete here.
  host.async_finish = false;
  staging.wait();
  DispatchResult result = host_call(host);
  result.recv_x = staging.to_device(result.recv_x);
  result.recv_x_scales = staging.to_device(result.recv_x_scales);
  result.recv_topk_idx = staging.to_device(result.recv_topk_idx);
  result.recv_topk_weights = staging.to_device(result.recv_topk_weights);
  staging.wait();
  return result;
}

CombineResult combine_on_device(gpu_side::device::DeviceRuntime& device, const CombineArgs& args,
                                const HostCombine& host_call) {
  Staging staging(device, "combine");
  CombineArgs host = args;
  host.x = staging.to_host(args.x);
  host.topk_weights = staging.to_host(args.topk_weights);
  host.bias0 = staging.to_host(args.bias0);
  host.bias1 = staging.to_host(args.bias1);
  host.async_finish = false;
  staging.wait();
  CombineResult result = host_call(host);
  result.combined_x = staging.to_device(result.combined_x);
  result.combined_topk_weights = staging.to_device(result.combined_topk_weights);
  staging.wait();
  return result;
}

}  // namespace proxyep::integrations
