// Normal mode for Python (DEEPEP_CONTRACT 2.3-2.6): DispatchHandle, the argument classes
// DispatchArgs and CombineArgs (keyword construction, read/write attributes: python/deep_ep
// builds them by name), and Buffer.get_dispatch_layout / dispatch / combine, which return
// DeepEP's tuples with DLPack capsules for the tensors.
#include "binding_helpers.hpp"
#include "bindings.hpp"
#include "native_buffer.hpp"
#include "tensor_bridge.hpp"

#include "integrations/buffer.hpp"

#include <pybind11/stl.h>

#include <memory>
#include <optional>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;

namespace proxyep::python {
namespace {

DispatchArgs make_dispatch_args(const py::handle& x, const py::handle& x_scales,
                                const DispatchHandle* handle, const py::handle& num_tokens_per_rank,
                                const py::handle& num_tokens_per_rdma_rank,
                                const py::handle& is_token_in_rank,
                                const py::handle& num_tokens_per_expert, const py::handle& topk_idx,
                                const py::handle& topk_weights, const py::handle& recv_stats,
                                int expert_alignment, int num_worst_tokens,
                                std::optional<Config> config, bool async_finish,
                                DeviceEventPtr previous_event) {
  DispatchArgs a;
  a.x = view_of(x, "x");
  a.x_scales = view_of(x_scales, "x_scales");
  a.handle = handle;
  a.num_tokens_per_rank = view_of(num_tokens_per_rank, "num_tokens_per_rank");
  a.num_tokens_per_rdma_rank = view_of(num_tokens_per_rdma_rank, "num_tokens_per_rdma_rank");
  a.is_token_in_rank = view_of(is_token_in_rank, "is_token_in_rank");
  a.num_tokens_per_expert = view_of(num_tokens_per_expert, "num_tokens_per_expert");
  a.topk_idx = view_of(topk_idx, "topk_idx");
  a.topk_weights = view_of(topk_weights, "topk_weights");
  a.recv_stats = view_of(recv_stats, "cumulative_local_expert_recv_stats");
  a.expert_alignment = expert_alignment;
  a.num_worst_tokens = num_worst_tokens;
  a.config = config;
  a.async_finish = async_finish;
  a.previous_event = std::move(previous_event);
  return a;
}

void bind_dispatch_args(py::module_& m) {
  const DispatchArgs defaults;  // the keyword defaults are the C++ struct's own
  py::class_<DispatchArgs> cls(m, "DispatchArgs",
                               "a normal-mode dispatch's arguments (integrations/normal_types.hpp)"
                               "; tensors as views (proxyep.view), None where absent");
  // Keyword-only: 14 fields are too many to pass by position without mixing two up.
  cls.def(
      py::init(&make_dispatch_args), py::kw_only(), py::arg("x") = py::none(),
      py::arg("x_scales") = py::none(), py::arg("handle") = nullptr,
      py::arg("num_tokens_per_rank") = py::none(), py::arg("num_tokens_per_rdma_rank") = py::none(),
      py::arg("is_token_in_rank") = py::none(), py::arg("num_tokens_per_expert") = py::none(),
      py::arg("topk_idx") = py::none(), py::arg("topk_weights") = py::none(),
      py::arg("recv_stats") = py::none(), py::arg("expert_alignment") = defaults.expert_alignment,
      py::arg("num_worst_tokens") = defaults.num_worst_tokens, py::arg("config") = py::none(),
      py::arg("async_finish") = defaults.async_finish, py::arg("previous_event") = nullptr,
      py::keep_alive<1, 4>());  // the handle (argument 3 after self), held by address
  def_tensor_field(cls, "x", &DispatchArgs::x);
  def_tensor_field(cls, "x_scales", &DispatchArgs::x_scales);
  def_handle_field(cls, "handle", &DispatchArgs::handle);
  def_tensor_field(cls, "num_tokens_per_rank", &DispatchArgs::num_tokens_per_rank);
  def_tensor_field(cls, "num_tokens_per_rdma_rank", &DispatchArgs::num_tokens_per_rdma_rank);
  def_tensor_field(cls, "is_token_in_rank", &DispatchArgs::is_token_in_rank);
  def_tensor_field(cls, "num_tokens_per_expert", &DispatchArgs::num_tokens_per_expert);
  def_tensor_field(cls, "topk_idx", &DispatchArgs::topk_idx);
  def_tensor_field(cls, "topk_weights", &DispatchArgs::topk_weights);
  def_tensor_field(cls, "recv_stats", &DispatchArgs::recv_stats,
                   "cumulative_local_expert_recv_stats");
  cls.def_readwrite("expert_alignment", &DispatchArgs::expert_alignment)
      .def_readwrite("num_worst_tokens", &DispatchArgs::num_worst_tokens)
      .def_readwrite("config", &DispatchArgs::config)
      .def_readwrite("async_finish", &DispatchArgs::async_finish)
      .def_readwrite("previous_event", &DispatchArgs::previous_event);
}

CombineArgs make_combine_args(const py::handle& x, const DispatchHandle* handle,
                              const py::handle& topk_weights, const py::handle& bias0,
                              const py::handle& bias1, const py::handle& order,
                              const py::handle& weight_owner, std::optional<Config> config,
                              bool async_finish, DeviceEventPtr previous_event) {
  CombineArgs a;
  a.x = view_of(x, "x");
  a.handle = handle;
  a.topk_weights = view_of(topk_weights, "topk_weights");
  a.bias0 = view_of(bias0, "bias[0]");
  a.bias1 = view_of(bias1, "bias[1]");
  a.order = view_of(order, "order");
  a.weight_owner = view_of(weight_owner, "weight_owner");
  a.config = config;
  a.async_finish = async_finish;
  a.previous_event = std::move(previous_event);
  return a;
}

void bind_combine_args(py::module_& m) {
  const CombineArgs defaults;  // the keyword defaults are the C++ struct's own
  py::class_<CombineArgs> cls(m, "CombineArgs",
                              "a normal-mode combine's arguments (integrations/normal_types.hpp)"
                              "; tensors as views (proxyep.view), None where absent");
  cls.def(py::init(&make_combine_args), py::kw_only(), py::arg("x") = py::none(),
          py::arg("handle") = nullptr, py::arg("topk_weights") = py::none(),
          py::arg("bias0") = py::none(), py::arg("bias1") = py::none(),
          py::arg("order") = py::none(), py::arg("weight_owner") = py::none(),
          py::arg("config") = py::none(), py::arg("async_finish") = defaults.async_finish,
          py::arg("previous_event") = nullptr,
          py::keep_alive<1, 3>());  // the handle (argument 2 after self), held by address
  def_tensor_field(cls, "x", &CombineArgs::x);
  def_handle_field(cls, "handle", &CombineArgs::handle);
  def_tensor_field(cls, "topk_weights", &CombineArgs::topk_weights);
  def_tensor_field(cls, "bias0", &CombineArgs::bias0, "bias[0]");
  def_tensor_field(cls, "bias1", &CombineArgs::bias1, "bias[1]");
  def_tensor_field(cls, "order", &CombineArgs::order);
  def_tensor_field(cls, "weight_owner", &CombineArgs::weight_owner);
  cls.def_readwrite("config", &CombineArgs::config)
      .def_readwrite("async_finish", &CombineArgs::async_finish)
      .def_readwrite("previous_event", &CombineArgs::previous_event);
}

void bind_dispatch_handle(py::module_& m) {
  py::class_<DispatchHandle>(m, "DispatchHandle")
      .def_property_readonly(
          "rank_prefix_matrix",
          [](const DispatchHandle& h) { return capsule_of(h.rank_prefix_matrix); })
      .def_property_readonly("recv_src_idx",
                             [](const DispatchHandle& h) { return capsule_of(h.recv_src_idx); })
      .def_property_readonly("is_token_in_rank",
                             [](const DispatchHandle& h) { return capsule_of(h.is_token_in_rank); })
      .def_property_readonly("send_head",
                             [](const DispatchHandle& h) { return capsule_of(h.send_head); })
      .def_readonly("num_tokens", &DispatchHandle::num_tokens)
      .def_readonly("num_recv_tokens", &DispatchHandle::num_recv_tokens)
      .def_readonly("hidden", &DispatchHandle::hidden);
}

// (num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank).
py::tuple layout_tuple(const DispatchLayout& l, const DeviceRelease& release) {
  return py::make_tuple(
      capsule_of(l.num_tokens_per_rank, &release), capsule_of(l.num_tokens_per_rdma_rank, &release),
      capsule_of(l.num_tokens_per_expert, &release), capsule_of(l.is_token_in_rank, &release));
}

py::tuple get_dispatch_layout(NativeBuffer& b, const py::handle& topk_idx, int num_experts,
                              DeviceEventPtr previous_event, uintptr_t caller_stream) {
  const ep::TensorRef idx = view_of(topk_idx, "topk_idx");
  previous_event =
      b.previous_event("get_dispatch_layout", {idx}, std::move(previous_event), caller_stream);
  const DispatchLayout layout =
      without_gil([&] { return b.get().get_dispatch_layout(idx, num_experts, previous_event); });
  return layout_tuple(layout, b.release(caller_stream));
}

// (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert,
// handle, event or None). `a` is the Python object's copy: its previous_event is replaced by
// the one the call orders after.
py::tuple dispatch(NativeBuffer& b, DispatchArgs a, uintptr_t caller_stream) {
  a.previous_event =
      b.previous_event("dispatch", {a.x, a.topk_idx, a.is_token_in_rank, a.recv_stats},
                       std::move(a.previous_event), caller_stream);
  DispatchResult r = without_gil([&] { return b.get().dispatch(a); });
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(r.recv_x, &release), capsule_of(r.recv_x_scales, &release),
                        capsule_of(r.recv_topk_idx, &release),
                        capsule_of(r.recv_topk_weights, &release),
                        py::cast(r.num_recv_tokens_per_expert), py::cast(std::move(r.handle)),
                        defined_or_none(r.event));
}

// (combined_x, combined_topk_weights, event or None). A missing handle is the runtime's to
// refuse (normal/combine.cpp), as for a C++ caller.
py::tuple combine(NativeBuffer& b, CombineArgs a, uintptr_t caller_stream) {
  a.previous_event = b.previous_event("combine", {a.x}, std::move(a.previous_event), caller_stream);
  const CombineResult r = without_gil([&] { return b.get().combine(a); });
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(r.combined_x, &release),
                        capsule_of(r.combined_topk_weights, &release), defined_or_none(r.event));
}

// A handle's tensors as a call hands them to torch: device ones released after the caller's
// stream (the handle's properties release them on the Buffer's stream only).
py::tuple normal_handle_tensors(NativeBuffer& b, const DispatchHandle& h, uintptr_t caller_stream) {
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(
      capsule_of(h.rank_prefix_matrix, &release), capsule_of(h.recv_src_idx, &release),
      capsule_of(h.is_token_in_rank, &release), capsule_of(h.send_head, &release));
}

}  // namespace

void bind_normal_types(py::module_& m) {
  bind_dispatch_handle(m);
  bind_dispatch_args(m);
  bind_combine_args(m);
}

void bind_normal_calls(BufferClass& buffer) {
  buffer
      .def("get_dispatch_layout", &get_dispatch_layout, py::arg("topk_idx"), py::arg("num_experts"),
           py::arg("previous_event") = nullptr, py::arg("caller_stream") = 0)
      .def("dispatch", &dispatch, py::arg("args"), py::arg("caller_stream") = 0)
      .def("combine", &combine, py::arg("args"), py::arg("caller_stream") = 0)
      .def("normal_handle_tensors", &normal_handle_tensors, py::arg("handle"),
           py::arg("caller_stream") = 0);
}

}  // namespace proxyep::python
