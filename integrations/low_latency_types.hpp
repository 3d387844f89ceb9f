// The low-latency mode's arguments and results (DEEPEP_CONTRACT 1.4 items 5-8, 2.7, 2.8):
// DeepEP's tuples as named structs. Buffer::low_latency_dispatch / low_latency_combine take and
// return these (buffer.hpp); the protocol is integrations/low_latency/.
//
// Three-dimensional outputs are stored as 2-D tensors with the leading dimensions flattened, so
// a Python binding makes DeepEP's views from them without copying:
//   recv_x        [E_local * R * T, H]   = DeepEP's [E_local, R*T, H] (row-major)
//   recv_x_scales [E_local * S, R * T]   = DeepEP's [E_local, R*T, S] with strides (S*R*T, 1, R*T):
//                                          column-major in the last two dimensions (TMA layout)
// where E_local = experts per rank, R = ranks, T = num_max_dispatch_tokens_per_rank, H = hidden,
// S = H / 128 float32 scales (or H / 512 int32 words of four UE8M0 exponent bytes).
#pragma once

#include "gpu_side/ep/tensor.hpp"

#include <cstdint>
#include <functional>
#include <memory>

namespace proxyep {

namespace gpu_side::device {
class DeviceEvent;  // gpu_side/device/device_runtime.hpp
}

namespace integrations::low_latency {
struct CallState;         // what a call in flight keeps (low_latency/ll_call.hpp)
struct CapturedDispatch;  // a dispatch captured into a graph (low_latency/ll_captured.hpp)
}  // namespace integrations::low_latency

// DeepEP's LL handle (src_info, layout_range, T, H, E) plus what combine needs.
struct LowLatencyHandle {
  gpu_side::ep::Tensor src_info;      // i32 [E_local, R*T]: token index at its source rank
  gpu_side::ep::Tensor layout_range;  // i64 [E_local, R]: (begin << 32) | count per source rank
  int num_max_dispatch_tokens_per_rank = 0;
  int hidden = 0;
  int num_experts = 0;
  // Where the dispatch's tensors were (integrations/device_ll_calls.hpp): a zero_copy combine
  // buffer of a device dispatch is device memory.
  gpu_side::ep::Device device = gpu_side::ep::Device::host;
  // The dispatch this handle came from (which Buffer, which call, what this rank sent where).
  std::shared_ptr<const integrations::low_latency::CallState> dispatched;
  // Or, for a dispatch captured into a graph, its step (the combine must be captured too).
  std::shared_ptr<integrations::low_latency::CapturedDispatch> captured;
};

// Completes the receive phase of a call started with return_recv_hook (DeepEP's `hook()`).
// Calling it twice is a no-op; a hook that is never called keeps its call in flight (the third
// call in flight is refused).
class RecvHook {
 public:
  RecvHook() = default;
  explicit RecvHook(std::function<void()> receive,
                    std::function<std::shared_ptr<gpu_side::device::DeviceEvent>()> point = {})
      : receive_(std::move(receive)), point_(std::move(point)) {}
  bool defined() const { return static_cast<bool>(receive_); }
  void operator()() const {
    if (receive_) receive_();
  }
  // A captured call's hook (low_latency/ll_captured.hpp) queues the receive into the capture:
  // after it ran, the point inside the graph where that receive ends, for the capturing stream
  // to join back (as the call's event); null before, and for other hooks.
  std::shared_ptr<gpu_side::device::DeviceEvent> device_point() const {
    return point_ ? point_() : nullptr;
  }

 private:
  std::function<void()> receive_;
  std::function<std::shared_ptr<gpu_side::device::DeviceEvent>()> point_;
};

// The event of an async_finish call: set when its receive phase completed in the background.
class CallEvent {
 public:
  CallEvent() = default;
  explicit CallEvent(std::function<void()> wait,
                     std::shared_ptr<gpu_side::device::DeviceEvent> device_point = nullptr)
      : wait_(std::move(wait)), device_point_(std::move(device_point)) {}
  bool defined() const { return static_cast<bool>(wait_); }
  // Waits for the call; rethrows its error (proxyep::Error naming the phase and the peer).
  void wait() const {
    if (wait_) wait_();
  }
  // A call with device tensors: a point of the Buffer's device (a stream of its own) reached
  // once the call ended, which a caller's stream may wait_event() for instead of the host
  // waiting (integrations/device_completion.hpp). Its outputs are complete there if the call
  // succeeded; whether it did, wait() says (the next Buffer call rethrows a failure too).
  // Null for a host call. For a captured low-latency call (low_latency/ll_captured.hpp) a point
  // inside the graph, where the capturing stream joins the Buffer's back; its wait() returns at
  // once (the graph's launches do the work).
  const std::shared_ptr<gpu_side::device::DeviceEvent>& device_point() const {
    return device_point_;
  }

 private:
  std::function<void()> wait_;
  std::shared_ptr<gpu_side::device::DeviceEvent> device_point_;
};

struct LowLatencyDispatchArgs {
  gpu_side::ep::TensorRef x;                 // bf16 [T', H], T' <= num_max_dispatch_tokens_per_rank
  gpu_side::ep::TensorRef topk_idx;          // i64 [T', K], -1 = no expert
  int num_max_dispatch_tokens_per_rank = 0;  // the same on every rank
  int num_experts = 0;
  // Written in place when given: i32 [E_local] += tokens received per local expert; i64 [R]
  // += nanoseconds this rank waited for each source rank's data.
  gpu_side::ep::TensorRef cumulative_local_expert_recv_stats;
  gpu_side::ep::TensorRef dispatch_wait_recv_cost_stats;
  bool use_fp8 = true;
  bool round_scale = false;       // scales rounded up to powers of two
  bool use_ue8m0 = false;         // scales as exponent bytes, four per int32 (needs round_scale)
  bool async_finish = false;      // send and receive in the background; `event` joins them
  bool return_recv_hook = false;  // send in the background, receive in `hook`
  // With device tensors: the Buffer's device stream reads the inputs after this point of the
  // caller's stream (DeviceRuntime::record; CudaDevice::record_on for a stream of the caller's).
  // DeepEP's LL calls run on the caller's stream; this Buffer's device work runs on its own.
  std::shared_ptr<gpu_side::device::DeviceEvent> previous_event;
};

struct LowLatencyDispatchResult {
  gpu_side::ep::Tensor recv_x;         // fp8_e4m3 or bf16 [E_local * R*T, H]
  gpu_side::ep::Tensor recv_x_scales;  // f32 [E_local * H/128, R*T] or i32 [E_local * H/512, R*T]
  gpu_side::ep::Tensor recv_count;     // i32 [E_local]: valid rows per local expert
  LowLatencyHandle handle;
  CallEvent event;  // with async_finish
  RecvHook hook;    // with return_recv_hook
};

// With return_recv_hook or async_finish, combine's send phase runs in the background: x (or the
// zero-copy buffer) must stay unchanged until the hook returns or the event is set.
struct LowLatencyCombineArgs {
  gpu_side::ep::TensorRef x;             // bf16 [E_local * R*T, H] (ignored with zero_copy)
  gpu_side::ep::TensorRef topk_idx;      // i64 [T', K]: this rank's routing at dispatch
  gpu_side::ep::TensorRef topk_weights;  // f32 [T', K]
  const LowLatencyHandle* handle = nullptr;
  bool use_logfmt = false;  // refused: LogFMT is not implemented
  bool zero_copy = false;   // x was written into get_next_low_latency_combine_buffer(handle)
  bool async_finish = false;
  bool return_recv_hook = false;
  gpu_side::ep::TensorRef out;  // bf16 [T', H], written in place when given
  gpu_side::ep::TensorRef combine_wait_recv_cost_stats;  // i64 [R], += ns waited per source
  std::shared_ptr<gpu_side::device::DeviceEvent> previous_event;  // as in the dispatch's args
};

struct LowLatencyCombineResult {
  gpu_side::ep::Tensor combined_x;  // bf16 [T', H]; undefined when `out` was given (it holds it)
  CallEvent event;
  RecvHook hook;
};

}  // namespace proxyep
