// What the bindings of both modes share: calls made with the GIL released, optional results as
// None, and the attributes of the argument classes (DispatchArgs, LowLatencyCombineArgs, ...),
// whose tensor fields Python sets from views (proxyep.view's tuples) and whose handle fields
// point at a handle the argument object keeps alive.
#pragma once

#include "tensor_bridge.hpp"

#include "gpu_side/ep/tensor.hpp"

#include <pybind11/pybind11.h>

#include <utility>

namespace proxyep::python {

using GilRelease = pybind11::gil_scoped_release;

// `call()` with the GIL released: the runtime's calls wait for peers and for the device, and
// other Python threads (a weight service, a data loader) must run meanwhile.
template <typename Call>
auto without_gil(Call&& call) {
  GilRelease unlocked;
  return std::forward<Call>(call)();
}

// A RecvHook or CallEvent the call made, or None (the call asked for neither).
template <typename T>
pybind11::object defined_or_none(const T& value) {
  return value.defined() ? pybind11::cast(value) : pybind11::none();
}

// A TensorRef field as a read/write attribute: set from a view (or None), read back as one.
// `label` names the tensor in errors (DeepEP's argument name, e.g. "bias[0]" for bias0).
template <typename Args>
void def_tensor_field(pybind11::class_<Args>& cls, const char* name,
                      gpu_side::ep::TensorRef Args::*field, const char* label = nullptr) {
  const char* named = label != nullptr ? label : name;
  cls.def_property(
      name, [field](const Args& a) { return spec_of(a.*field); },
      [field, named](Args& a, const pybind11::handle& spec) { a.*field = view_of(spec, named); });
}

// A `const Handle*` field as a read/write attribute (None: no handle). The argument object
// keeps the handle it was given alive, since the C++ struct holds only its address.
template <typename Args, typename Handle>
void def_handle_field(pybind11::class_<Args>& cls, const char* name, const Handle* Args::*field) {
  cls.def_property(name,
                   pybind11::cpp_function([field](const Args& a) { return a.*field; },
                                          pybind11::return_value_policy::reference),
                   pybind11::cpp_function([field](Args& a, const Handle* h) { a.*field = h; },
                                          pybind11::keep_alive<1, 2>()));
}

}  // namespace proxyep::python
