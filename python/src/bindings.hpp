// The pieces of the _proxyep module, each defined in its own file.
#pragma once

#include <pybind11/pybind11.h>

namespace proxyep::python {

void bind_config(pybind11::module_& m);    // config_binding.cpp: Config, tables, size hints
void bind_buffer(pybind11::module_& m);    // buffer_binding.cpp: Buffer, handles, hooks, events
void bind_device(pybind11::module_& m);    // device_binding.cpp: Device, DeviceEvent
void bind_rma_link(pybind11::module_& m);  // rma_link_binding.cpp: RmaReceiver, RmaSender

}  // namespace proxyep::python
