// Normal-mode calls with device tensors on the direct path (device_calls.hpp).
#include "integrations/device_calls.hpp"

#include "common/error.hpp"
#include "integrations/device_steering.hpp"

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

bool captured_point(const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  return event != nullptr && event->captured();
}

DispatchResult dispatch_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  RowBackend& backend, normal::NormalMode& mode,
                                  const DispatchArgs& args) {
  // Every read of the inputs, the steering copies' and the kernels', after previous_event.
  DeviceSteering steering(device, "dispatch");
  steering.order_after(args.previous_event);
  normal::DeviceCall call{.backend = backend, .steering = {}};
  if (args.handle == nullptr) {
    call.steering.is_token_in_rank = steering.to_host(args.is_token_in_rank);
    call.steering.num_tokens_per_rank = steering.to_host(args.num_tokens_per_rank);
    call.steering.num_tokens_per_expert = steering.to_host(args.num_tokens_per_expert);
  }
  // Fresh, or a cached dispatch carrying top-k again (DeepEP V2's): the values are checked.
  call.steering.topk_idx = steering.to_host(args.topk_idx);
  steering.wait();
  return mode.dispatch(args, &call);
}

CombineResult combine_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                RowBackend& backend, normal::NormalMode& mode,
                                const CombineArgs& args) {
  order_after(*device, args.previous_event, "combine");  // every read of x and the weights
  const normal::DeviceCall call{.backend = backend, .steering = {}};
  return mode.combine(args, &call);
}

}  // namespace proxyep::integrations
