// The pieces of the _proxyep module, each defined in its own file.
#pragma once

#include <pybind11/pybind11.h>

namespace proxyep::python {

class NativeBuffer;  // native_buffer.hpp: what _proxyep.Buffer wraps
using BufferClass = pybind11::class_<NativeBuffer>;

void bind_config(pybind11::module_& m);    // config_binding.cpp: Config, tables, size hints
void bind_device(pybind11::module_& m);    // device_binding.cpp: Device, DeviceEvent
void bind_rma_link(pybind11::module_& m);  // rma_link_binding.cpp: RmaReceiver, RmaSender
// buffer_binding.cpp: Buffer (construction, BufferOptions, stats, lifecycle), hooks, events;
// it binds the modes' types and calls below onto the Buffer it makes.
void bind_buffer(pybind11::module_& m);
// normal_binding.cpp: DispatchHandle, DispatchArgs, CombineArgs; layout, dispatch, combine.
void bind_normal_types(pybind11::module_& m);
void bind_normal_calls(BufferClass& buffer);
// elastic_binding.cpp: ElasticFields; DeepEP V2's dispatch as one call, its handle's source
// metadata, the expanded layout's fold and per-slot combine.
void bind_elastic_types(pybind11::module_& m);
void bind_elastic_calls(BufferClass& buffer);
// low_latency_binding.cpp: LowLatencyHandle, LowLatency{Dispatch,Combine}Args; the LL calls.
void bind_low_latency_types(pybind11::module_& m);
void bind_low_latency_calls(BufferClass& buffer);

}  // namespace proxyep::python
