// DeviceStaging: host copies of a device call's tensors, and device copies of its host outputs,
// moved on the device's stream (device_ll_calls.hpp; device_calls.hpp copies a dispatch's
// steering tensors with it). This is the host bounce buffer of EFA_LIBFABRIC.md, used by the
// low-latency calls for now: the protocol runs unchanged on the host copies. Every copy is queued;
// wait() makes the queued ones complete. The host buffers (and the device the staging uses) live as
// long as the staging, so a call that finishes later (a receive hook, an async event) keeps it in
// its closure.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/comm_stream.hpp"
#include "integrations/low_latency_types.hpp"

#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::integrations {

// Makes the work `device` queues from here on wait for `event` (a call's previous_event; none: no
// wait), for at most ep.timeout_ms.
void order_after(gpu_side::device::DeviceRuntime& device,
                 const std::shared_ptr<gpu_side::device::DeviceEvent>& event);

// A device output (from device_like) and the host protocol's tensor that fills it.
struct StagedOutput {
  gpu_side::ep::Tensor device, host;
};

class DeviceStaging {
 public:
  DeviceStaging(std::shared_ptr<gpu_side::device::DeviceRuntime> device, std::string_view phase);

  // Makes the copies queued from here on wait for `event` (none: no wait), the caller's
  // previous_event.
  void order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event);

  // A host view of device tensor `t` with its shape and strides, filled by the next wait().
  // Copies the span the strides cover (column-major scales included); undefined stays undefined.
  gpu_side::ep::TensorRef to_host(const gpu_side::ep::TensorRef& t);
  // to_host(t) for a tensor the call overwrites in place (`out`, a mask query's output):
  // write_back() copies the view back over `t`.
  gpu_side::ep::TensorRef in_out(const gpu_side::ep::TensorRef& t);
  // A zeroed host view shaped as `t` (i32 or i64), for a tensor the call adds to (the
  // cumulative statistics): write_back() adds it to `t`'s values at that point. (A snapshot
  // copied back would lose the counts of another call in flight that finished in between.)
  gpu_side::ep::TensorRef accumulate(const gpu_side::ep::TensorRef& t);
  // Queues the in_out copies and performs the accumulations (each waits for the stream).
  void write_back();

  // A device tensor of `host`'s dtype and shape (undefined stays undefined), uninitialised.
  gpu_side::ep::Tensor device_like(const gpu_side::ep::Tensor& host);
  // Queues the copy of `host` into `device` (both from device_like), holding `host` until the
  // staging goes.
  void upload(gpu_side::ep::Tensor device, const gpu_side::ep::Tensor& host);
  // Replaces a host protocol's output with device_like(output) and returns the pair, for
  // finish_on_device to fill.
  StagedOutput move_to_device(gpu_side::ep::Tensor& output);

  // Waits (ep.timeout_ms) for every copy queued so far; throws proxyep::Error(phase).
  void wait();

 private:
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::string_view phase_;  // a literal
  std::vector<gpu_side::ep::Tensor> held_;
  gpu_side::ep::TensorRef host_view(const gpu_side::ep::TensorRef& t, bool zeroed);
  struct WriteBack {
    void* device;
    gpu_side::ep::Tensor host;
    bool add;  // accumulate: add `host` to the device's values; else copy it over them
  };
  std::vector<WriteBack> write_backs_;
};

// Fills `outputs` and writes the staging's in-place tensors back once the host call is complete:
// now (neither `hook` nor `event` defined), after the hook's receive phase (`hook` is wrapped),
// or on the stream right after the call's background work (`event` is replaced; waiting for it,
// or any later Buffer call, finds the outputs filled). The staging, with its host copies, is
// held until the stream has passed the call's work, which reads them even when a hook is
// dropped uncalled.
void finish_on_device(CommStream& stream, const std::shared_ptr<DeviceStaging>& staging,
                      std::vector<StagedOutput> outputs, RecvHook& hook, CallEvent& event);

}  // namespace proxyep::integrations
