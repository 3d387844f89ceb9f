// Low-latency mode for Python (DEEPEP_CONTRACT 2.7, 2.8): LowLatencyHandle, the argument classes
// LowLatencyDispatchArgs and LowLatencyCombineArgs (keyword construction, read/write
// attributes), and the Buffer's low-latency calls: dispatch and combine (capturable into a CUDA
// graph: they join the caller's capture and back), the zero-copy combine buffer, and rank masks.
#include "binding_helpers.hpp"
#include "bindings.hpp"
#include "native_buffer.hpp"
#include "tensor_bridge.hpp"

#include "integrations/buffer.hpp"

#include <pybind11/stl.h>

#include <memory>

namespace py = pybind11;

namespace proxyep::python {
namespace {

void bind_low_latency_handle(py::module_& m) {
  py::class_<LowLatencyHandle>(m, "LowLatencyHandle")
      .def_property_readonly("src_info",
                             [](const LowLatencyHandle& h) { return capsule_of(h.src_info); })
      .def_property_readonly("layout_range",
                             [](const LowLatencyHandle& h) { return capsule_of(h.layout_range); })
      .def_readonly("num_max_dispatch_tokens_per_rank",
                    &LowLatencyHandle::num_max_dispatch_tokens_per_rank)
      .def_readonly("hidden", &LowLatencyHandle::hidden)
      .def_readonly("num_experts", &LowLatencyHandle::num_experts);
}

LowLatencyDispatchArgs make_dispatch_args(const py::handle& x, const py::handle& topk_idx,
                                          int num_max_dispatch_tokens_per_rank, int num_experts,
                                          const py::handle& cumulative_local_expert_recv_stats,
                                          const py::handle& dispatch_wait_recv_cost_stats,
                                          bool use_fp8, bool round_scale, bool use_ue8m0,
                                          bool async_finish, bool return_recv_hook,
                                          DeviceEventPtr previous_event) {
  LowLatencyDispatchArgs a;
  a.x = view_of(x, "x");
  a.topk_idx = view_of(topk_idx, "topk_idx");
  a.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank;
  a.num_experts = num_experts;
  a.cumulative_local_expert_recv_stats =
      view_of(cumulative_local_expert_recv_stats, "cumulative_local_expert_recv_stats");
  a.dispatch_wait_recv_cost_stats =
      view_of(dispatch_wait_recv_cost_stats, "dispatch_wait_recv_cost_stats");
  a.use_fp8 = use_fp8;
  a.round_scale = round_scale;
  a.use_ue8m0 = use_ue8m0;
  a.async_finish = async_finish;
  a.return_recv_hook = return_recv_hook;
  a.previous_event = std::move(previous_event);
  return a;
}

void bind_dispatch_args(py::module_& m) {
  const LowLatencyDispatchArgs defaults;  // the keyword defaults are the C++ struct's own
  using Args = LowLatencyDispatchArgs;
  py::class_<Args> cls(m, "LowLatencyDispatchArgs",
                       "a low-latency dispatch's arguments (integrations/low_latency_types.hpp); "
                       "tensors as views (proxyep.view), None where absent");
  // Keyword-only, as DispatchArgs: a dozen fields, several of them bools side by side.
  cls.def(
      py::init(&make_dispatch_args), py::kw_only(), py::arg("x") = py::none(),
      py::arg("topk_idx") = py::none(),
      py::arg("num_max_dispatch_tokens_per_rank") = defaults.num_max_dispatch_tokens_per_rank,
      py::arg("num_experts") = defaults.num_experts,
      py::arg("cumulative_local_expert_recv_stats") = py::none(),
      py::arg("dispatch_wait_recv_cost_stats") = py::none(), py::arg("use_fp8") = defaults.use_fp8,
      py::arg("round_scale") = defaults.round_scale, py::arg("use_ue8m0") = defaults.use_ue8m0,
      py::arg("async_finish") = defaults.async_finish,
      py::arg("return_recv_hook") = defaults.return_recv_hook, py::arg("previous_event") = nullptr);
  def_tensor_field(cls, "x", &Args::x);
  def_tensor_field(cls, "topk_idx", &Args::topk_idx);
  cls.def_readwrite("num_max_dispatch_tokens_per_rank", &Args::num_max_dispatch_tokens_per_rank)
      .def_readwrite("num_experts", &Args::num_experts);
  def_tensor_field(cls, "cumulative_local_expert_recv_stats",
                   &Args::cumulative_local_expert_recv_stats);
  def_tensor_field(cls, "dispatch_wait_recv_cost_stats", &Args::dispatch_wait_recv_cost_stats);
  cls.def_readwrite("use_fp8", &Args::use_fp8)
      .def_readwrite("round_scale", &Args::round_scale)
      .def_readwrite("use_ue8m0", &Args::use_ue8m0)
      .def_readwrite("async_finish", &Args::async_finish)
      .def_readwrite("return_recv_hook", &Args::return_recv_hook)
      .def_readwrite("previous_event", &Args::previous_event);
}

LowLatencyCombineArgs make_combine_args(const py::handle& x, const py::handle& topk_idx,
                                        const py::handle& topk_weights,
                                        const LowLatencyHandle* handle, bool use_logfmt,
                                        bool zero_copy, bool async_finish, bool return_recv_hook,
                                        const py::handle& out,
                                        const py::handle& combine_wait_recv_cost_stats,
                                        DeviceEventPtr previous_event) {
  LowLatencyCombineArgs a;
  a.x = view_of(x, "x");
  a.topk_idx = view_of(topk_idx, "topk_idx");
  a.topk_weights = view_of(topk_weights, "topk_weights");
  a.handle = handle;
  a.use_logfmt = use_logfmt;
  a.zero_copy = zero_copy;
  a.async_finish = async_finish;
  a.return_recv_hook = return_recv_hook;
  a.out = view_of(out, "out");
  a.combine_wait_recv_cost_stats =
      view_of(combine_wait_recv_cost_stats, "combine_wait_recv_cost_stats");
  a.previous_event = std::move(previous_event);
  return a;
}

void bind_combine_args(py::module_& m) {
  const LowLatencyCombineArgs defaults;  // the keyword defaults are the C++ struct's own
  using Args = LowLatencyCombineArgs;
  py::class_<Args> cls(m, "LowLatencyCombineArgs",
                       "a low-latency combine's arguments (integrations/low_latency_types.hpp); "
                       "tensors as views (proxyep.view), None where absent");
  cls.def(py::init(&make_combine_args), py::kw_only(), py::arg("x") = py::none(),
          py::arg("topk_idx") = py::none(), py::arg("topk_weights") = py::none(),
          py::arg("handle") = nullptr, py::arg("use_logfmt") = defaults.use_logfmt,
          py::arg("zero_copy") = defaults.zero_copy,
          py::arg("async_finish") = defaults.async_finish,
          py::arg("return_recv_hook") = defaults.return_recv_hook, py::arg("out") = py::none(),
          py::arg("combine_wait_recv_cost_stats") = py::none(), py::arg("previous_event") = nullptr,
          py::keep_alive<1, 5>());  // the handle (argument 4 after self), held by address
  def_tensor_field(cls, "x", &Args::x);
  def_tensor_field(cls, "topk_idx", &Args::topk_idx);
  def_tensor_field(cls, "topk_weights", &Args::topk_weights);
  def_handle_field(cls, "handle", &Args::handle);
  cls.def_readwrite("use_logfmt", &Args::use_logfmt)
      .def_readwrite("zero_copy", &Args::zero_copy)
      .def_readwrite("async_finish", &Args::async_finish)
      .def_readwrite("return_recv_hook", &Args::return_recv_hook);
  def_tensor_field(cls, "out", &Args::out);
  def_tensor_field(cls, "combine_wait_recv_cost_stats", &Args::combine_wait_recv_cost_stats);
  cls.def_readwrite("previous_event", &Args::previous_event);
}

// (recv_x, recv_x_scales, recv_count, handle, event or None, hook or None). `a` is the Python
// object's copy: its previous_event is replaced by the one the call orders after.
py::tuple low_latency_dispatch(NativeBuffer& b, LowLatencyDispatchArgs a, uintptr_t caller_stream) {
  a.previous_event = b.previous_event("low_latency_dispatch", {a.x, a.topk_idx},
                                      std::move(a.previous_event), caller_stream, true);
  LowLatencyDispatchResult r = without_gil([&] { return b.get().low_latency_dispatch(a); });
  b.join_back(r.event, caller_stream, "low_latency_dispatch");
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(r.recv_x, &release), capsule_of(r.recv_x_scales, &release),
                        capsule_of(r.recv_count, &release), py::cast(std::move(r.handle)),
                        defined_or_none(r.event), defined_or_none(r.hook));
}

// (combined_x, event or None, hook or None).
py::tuple low_latency_combine(NativeBuffer& b, LowLatencyCombineArgs a, uintptr_t caller_stream) {
  a.previous_event = b.previous_event("low_latency_combine", {a.x, a.topk_idx},
                                      std::move(a.previous_event), caller_stream, true);
  const LowLatencyCombineResult r = without_gil([&] { return b.get().low_latency_combine(a); });
  b.join_back(r.event, caller_stream, "low_latency_combine");
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(r.combined_x, &release), defined_or_none(r.event),
                        defined_or_none(r.hook));
}

// A handle's tensors as a call hands them to torch: device ones released after the caller's
// stream (the handle's properties release them on the Buffer's stream only).
py::tuple low_latency_handle_tensors(NativeBuffer& b, const LowLatencyHandle& h,
                                     uintptr_t caller_stream) {
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(h.src_info, &release), capsule_of(h.layout_range, &release));
}

// Rank masking (enable_shrink): mask or unmask a rank, read the mask, clear it.
void bind_mask_calls(BufferClass& buffer) {
  buffer
      .def(
          "low_latency_update_mask_buffer",
          [](NativeBuffer& b, int rank, bool mask) {
            b.get().low_latency_update_mask_buffer(rank, mask);
          },
          py::arg("rank_to_mask"), py::arg("mask") = false)
      .def(
          "low_latency_query_mask_buffer",
          [](NativeBuffer& b, const py::handle& out) {
            b.get().low_latency_query_mask_buffer(view_of(out, "mask_status"));
          },
          py::arg("mask_status"))
      .def("low_latency_clean_mask_buffer",
           [](NativeBuffer& b) { b.get().low_latency_clean_mask_buffer(); });
}

}  // namespace

void bind_low_latency_types(py::module_& m) {
  bind_low_latency_handle(m);
  bind_dispatch_args(m);
  bind_combine_args(m);
}

void bind_low_latency_calls(BufferClass& buffer) {
  buffer
      .def(
          "clean_low_latency_buffer",
          [](NativeBuffer& b, int tokens, int hidden, int experts) {
            b.get().clean_low_latency_buffer(tokens, hidden, experts);
          },
          py::call_guard<GilRelease>(), py::arg("num_max_dispatch_tokens_per_rank"),
          py::arg("hidden"), py::arg("num_experts"))
      .def("low_latency_dispatch", &low_latency_dispatch, py::arg("args"),
           py::arg("caller_stream") = 0)
      .def("low_latency_combine", &low_latency_combine, py::arg("args"),
           py::arg("caller_stream") = 0)
      .def("low_latency_handle_tensors", &low_latency_handle_tensors, py::arg("handle"),
           py::arg("caller_stream") = 0)
      .def(
          "get_next_low_latency_combine_buffer",
          [](NativeBuffer& b, const LowLatencyHandle& handle) {
            return capsule_of(b.get().get_next_low_latency_combine_buffer(handle));
          },
          py::arg("handle"));
  bind_mask_calls(buffer);
}

}  // namespace proxyep::python
