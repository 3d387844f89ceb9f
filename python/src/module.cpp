// _proxyep: the native half of the `proxyep` and `deep_ep` Python packages (python/proxyep,
// python/deep_ep). It binds proxyep::Buffer over views of torch tensors; the packages give it
// DeepEP's Python surface.
#include "bindings.hpp"

#include "common/error.hpp"
#include "common/signal_hygiene.hpp"

#include <pybind11/stl.h>

namespace py = pybind11;

PYBIND11_MODULE(_proxyep, m) {
  m.doc() = "ProxyEP's native module (use the proxyep and deep_ep packages)";
  // Every runtime error (phase + message naming the peer) reaches Python as ProxyEPError, a
  // RuntimeError, with the runtime's text.
  static py::exception<proxyep::Error> error(m, "ProxyEPError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const proxyep::Error& e) {
      error(e.what());
    }
  });
  proxyep::python::bind_config(m);
  proxyep::python::bind_device(m);
  proxyep::python::bind_buffer(m);
  proxyep::python::bind_rma_link(m);
  // The package sets IPATH_NO_BACKTRACE / HFI_NO_BACKTRACE before loading this module; where
  // something loaded those libraries earlier, it puts Python's handlers back with this.
  m.def("restore_signals_taken_by_libraries", &proxyep::restore_signals_taken_by_libraries,
        "default actions back for the signals a PSM library took; returns those signals");
}
