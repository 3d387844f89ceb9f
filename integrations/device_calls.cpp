// Normal-mode calls with device tensors, staged through host memory (device_calls.hpp).
#include "integrations/device_calls.hpp"

#include "common/error.hpp"
#include "integrations/device_staging.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

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

void require_event_on_device(std::string_view phase, bool on_device,
                             const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  require(event == nullptr || on_device, phase,
          "previous_event orders the Buffer's device stream, but this call's tensors are in host "
          "memory (pass no event, or device tensors)");
}

DispatchResult dispatch_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  CommStream& stream, const DispatchArgs& args,
                                  const HostDispatch& host_call) {
  auto staging = std::make_shared<DeviceStaging>(device, "dispatch");
  staging->order_after(args.previous_event);
  DispatchArgs host = args;
  host.x = staging->to_host(args.x);
  host.x_scales = staging->to_host(args.x_scales);
  host.num_tokens_per_rank = staging->to_host(args.num_tokens_per_rank);
  host.num_tokens_per_rdma_rank = staging->to_host(args.num_tokens_per_rdma_rank);
  host.is_token_in_rank = staging->to_host(args.is_token_in_rank);
  host.num_tokens_per_expert = staging->to_host(args.num_tokens_per_expert);
  host.topk_idx = staging->to_host(args.topk_idx);
  host.topk_weights = staging->to_host(args.topk_weights);
  staging->wait();
  DispatchResult result = host_call(host);
  RecvHook no_hook;
  finish_on_device(
      stream, staging,
      {staging->move_to_device(result.recv_x), staging->move_to_device(result.recv_x_scales),
       staging->move_to_device(result.recv_topk_idx),
       staging->move_to_device(result.recv_topk_weights)},
      no_hook, result.event);
  return result;
}

CombineResult combine_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                CommStream& stream, const CombineArgs& args,
                                const HostCombine& host_call) {
  auto staging = std::make_shared<DeviceStaging>(device, "combine");
  staging->order_after(args.previous_event);
  CombineArgs host = args;
  host.x = staging->to_host(args.x);
  host.topk_weights = staging->to_host(args.topk_weights);
  host.bias0 = staging->to_host(args.bias0);
  host.bias1 = staging->to_host(args.bias1);
  staging->wait();
  CombineResult result = host_call(host);
  RecvHook no_hook;
  finish_on_device(stream, staging,
                   {staging->move_to_device(result.combined_x),
                    staging->move_to_device(result.combined_topk_weights)},
                   no_hook, result.event);
  return result;
}

}  // namespace proxyep::integrations
