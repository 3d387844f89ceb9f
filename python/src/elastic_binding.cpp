// DeepEP V2's dispatch for Python (python/deep_ep/buffers/elastic.py): Buffer.elastic_dispatch,
// the layout, the normal-mode dispatch and the EPHandle fields in one native call
// (integrations/elastic/elastic_dispatch.hpp), and Buffer.elastic_source_metadata, which an async
// call's handle computes once its rows are in. V2's combine is V1's (normal_binding.cpp).
#include "binding_helpers.hpp"
#include "bindings.hpp"
#include "native_buffer.hpp"
#include "tensor_bridge.hpp"

#include "integrations/elastic/elastic_dispatch.hpp"
#include "integrations/elastic/slot_combine.hpp"

#include <pybind11/stl.h>

#include <iterator>
#include <memory>
#include <string>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;
namespace elastic = proxyep::integrations::elastic;

namespace proxyep::python {
namespace {

// A fresh dispatch's EPHandle fields (elastic::ElasticFields), kept native until Python reads
// one: each read makes a DLPack capsule (take), so a dispatch pays for none nobody reads.
struct NativeFields {
  elastic::ElasticFields fields;

  // 0 psum_per_scaleup_rank, 1 psum_per_expert, 2 unaligned_per_expert, 3 dst_buffer_slot_idx,
  // 4 recv_src_metadata, 5 combine_order, 6 weight_owner; None for an undefined one.
  py::object take(int which) const {
    const ep::Tensor* all[] = {&fields.psum_per_scaleup_rank, &fields.psum_per_expert,
                               &fields.unaligned_per_expert,  &fields.dst_buffer_slot_idx,
                               &fields.recv_src_metadata,     &fields.combine_order,
                               &fields.weight_owner};
    if (which < 0 || which >= static_cast<int>(std::size(all)))
      throw py::index_error("ElasticFields.take: no field " + std::to_string(which));
    return capsule_of(*all[which]);
  }
};

// (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert (aligned,
// a list), handle, event or None, ElasticFields (NativeFields; a cached dispatch's are all
// undefined), whether recv_src_metadata was computed, (expanded x, scales, weights, slots),
// layout); None for what is undefined. `layout`, the tensors the call was routed by, is the
// caller's to keep until an async call's event is set.
py::tuple elastic_dispatch(NativeBuffer& b, DispatchArgs a, int num_experts,
                           int64_t num_max_tokens_per_rank, int num_scaleup_ranks, bool expand,
                           bool zero_padding, const py::handle& cached_metadata,
                           int64_t cached_slots, uintptr_t caller_stream) {
  const ep::TensorRef metadata = view_of(cached_metadata, "recv_src_metadata");
  a.previous_event = b.previous_event("dispatch", {a.x, a.topk_idx, a.recv_stats},
                                      std::move(a.previous_event), caller_stream);
  elastic::ElasticDispatchResult r = without_gil([&] {
    return elastic::elastic_dispatch(b.get(), {.v1 = std::move(a),
                                               .num_experts = num_experts,
                                               .num_max_tokens_per_rank = num_max_tokens_per_rank,
                                               .num_scaleup_ranks = num_scaleup_ranks,
                                               .expand = expand,
                                               .zero_padding = zero_padding,
                                               .cached_metadata = metadata,
                                               .cached_slots = cached_slots});
  });
  const DeviceRelease release = b.release(caller_stream);
  const DispatchLayout& l = r.layout;
  const bool has_metadata = r.fields.recv_src_metadata.defined();
  return py::make_tuple(
      capsule_of(r.v1.recv_x, &release), capsule_of(r.v1.recv_x_scales, &release),
      capsule_of(r.v1.recv_topk_idx, &release), capsule_of(r.v1.recv_topk_weights, &release),
      py::cast(r.v1.num_recv_tokens_per_expert), py::cast(std::move(r.v1.handle)),
      defined_or_none(r.v1.event), py::cast(std::make_shared<NativeFields>(std::move(r.fields))),
      has_metadata,
      py::make_tuple(capsule_of(r.expanded.x, &release), capsule_of(r.expanded.scales, &release),
                     capsule_of(r.expanded.weights, &release), r.expanded.slots),
      py::make_tuple(capsule_of(l.num_tokens_per_rank, &release),
                     capsule_of(l.num_tokens_per_rdma_rank, &release),
                     capsule_of(l.num_tokens_per_expert, &release),
                     capsule_of(l.is_token_in_rank, &release)));
}

// (x, weights or None): an expanded combine's input folded to one row per received token, in the
// memory x is in (device outputs released after `caller_stream`'s reads, as a call's).
py::tuple elastic_fold(NativeBuffer& b, const py::handle& x, const py::handle& weights,
                       const py::handle& metadata, int64_t num_recv, uintptr_t caller_stream) {
  const ep::TensorRef xs = view_of(x, "x"), w = view_of(weights, "topk_weights"),
                      m = view_of(metadata, "recv_src_metadata");
  const elastic::Folded f =
      without_gil([&] { return elastic::fold_expanded_rows(b.get(), xs, w, m, num_recv); });
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(f.x, &release), capsule_of(f.weights, &release));
}

// (combined_x, combined_weights or None): DeepEP V2's combine of the expanded layout without
// multiple reduction (slot_combine.hpp), complete at return.
py::tuple elastic_combine_slots(NativeBuffer& b, const py::handle& x, const py::handle& weights,
                                const py::handle& bias0, const py::handle& bias1,
                                const DispatchHandle& handle, const py::handle& metadata,
                                const py::handle& topk_idx, int num_experts,
                                uintptr_t caller_stream) {
  const elastic::SlotCombineArgs args{.x = view_of(x, "x"),
                                      .weights = view_of(weights, "topk_weights"),
                                      .bias0 = view_of(bias0, "bias[0]"),
                                      .bias1 = view_of(bias1, "bias[1]"),
                                      .handle = &handle,
                                      .metadata = view_of(metadata, "recv_src_metadata"),
                                      .topk_idx = view_of(topk_idx, "topk_idx"),
                                      .num_experts = num_experts};
  const CombineResult r = without_gil([&] { return elastic::combine_slots(b.get(), args); });
  const DeviceRelease release = b.release(caller_stream);
  return py::make_tuple(capsule_of(r.combined_x, &release),
                        capsule_of(r.combined_topk_weights, &release));
}

py::object elastic_source_metadata(NativeBuffer& b, const DispatchHandle& handle,
                                   const py::handle& recv_topk_idx, int num_experts,
                                   int64_t num_max_tokens_per_rank) {
  const ep::TensorRef idx = view_of(recv_topk_idx, "recv_topk_idx");
  return capsule_of(without_gil([&] {
    return elastic::source_metadata(b.get(), handle, idx, num_experts, num_max_tokens_per_rank);
  }));
}

}  // namespace

void bind_elastic_types(py::module_& m) {
  py::class_<NativeFields, std::shared_ptr<NativeFields>>(m, "ElasticFields")
      .def("take", &NativeFields::take, py::arg("which"));
}

void bind_elastic_calls(BufferClass& buffer) {
  buffer
      .def("elastic_dispatch", &elastic_dispatch, py::arg("args"), py::arg("num_experts"),
           py::arg("num_max_tokens_per_rank"), py::arg("num_scaleup_ranks"),
           py::arg("expand") = false, py::arg("zero_padding") = false,
           py::arg("cached_metadata") = py::none(), py::arg("cached_slots") = 0,
           py::arg("caller_stream") = 0)
      .def("elastic_fold", &elastic_fold, py::arg("x"), py::arg("topk_weights"),
           py::arg("recv_src_metadata"), py::arg("num_recv"), py::arg("caller_stream") = 0)
      .def("elastic_combine_slots", &elastic_combine_slots, py::arg("x"), py::arg("topk_weights"),
           py::arg("bias0"), py::arg("bias1"), py::arg("handle"), py::arg("recv_src_metadata"),
           py::arg("topk_idx"), py::arg("num_experts"), py::arg("caller_stream") = 0)
      .def("elastic_source_metadata", &elastic_source_metadata, py::arg("handle"),
           py::arg("recv_topk_idx"), py::arg("num_experts"), py::arg("num_max_tokens_per_rank"));
}

}  // namespace proxyep::python
