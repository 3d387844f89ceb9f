// _proxyep.Device: the device a Buffer's device tensors live on (gpu_side/device/open_device.hpp),
// and what the Python side needs of it: its kind, whether this build has CUDA, tensors moved to
// and from it (the simulated device's memory is host memory no torch allocator knows: tests put
// inputs there and read outputs back through these), events on a stream of the caller's
// (torch's current stream), and its own stream (DeepEP's get_comm_stream).
#include "bindings.hpp"
#include "tensor_bridge.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/device/open_device.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;
namespace device = proxyep::gpu_side::device;

namespace proxyep::python {
namespace {

constexpr const char* kPhase = "python(device)";

std::chrono::milliseconds copy_timeout() {
  return std::chrono::milliseconds(params::ep_timeout_ms.get());
}

// A contiguous host Tensor shaped as `t`.
ep::Tensor host_like(const ep::TensorRef& t) {
  return t.dims == 1 ? ep::Tensor::empty(t.dtype, t.rows)
                     : ep::Tensor::empty(t.dtype, t.rows, t.cols);
}

// A copy of the tensor `spec` views, moved to (`to_device`) or from the device, waiting for it.
ep::Tensor moved(device::DeviceRuntime& d, const py::handle& spec, bool to_device) {
  const ep::TensorRef from = view_of(spec, "tensor");
  require(from.defined(), kPhase, "nothing to copy (None)");
  require(from.contiguous(), kPhase, "copies take contiguous tensors; got {}", from);
  require((from.device == ep::Device::cuda) != to_device, kPhase,
          "to_{}: the tensor is {} memory already", to_device ? "device" : "host",
          to_device ? "device" : "host");
  ep::Tensor to;
  if (to_device) {
    to = ep::Tensor::over(d.allocate(from.bytes()), from.dtype, from.rows,
                          from.dims == 1 ? -1 : from.cols, ep::Device::cuda);
  } else {
    to = host_like(from);
  }
  py::gil_scoped_release unlocked;
  d.copy(to.raw(), from.data, from.bytes());
  d.synchronize(kPhase, copy_timeout());
  return to;
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<device::DeviceEvent, std::shared_ptr<device::DeviceEvent>>(m, "DeviceEvent");

  m.def("built_with_cuda", &device::built_with_cuda,
        "whether this build has the CUDA device (a GPU is still needed to open one)");

  py::class_<device::DeviceRuntime, std::shared_ptr<device::DeviceRuntime>>(m, "Device")
      .def_static(
          "open",
          [](const std::string& kind, int local_rank) {
            require(kind != "host", kPhase, "\"host\" is no device: make the Buffer without one");
            return device::open_device(kind, local_rank, kPhase);
          },
          py::arg("kind"), py::arg("local_rank") = 0,
          "\"simulated\" or \"cuda\" (the GPU of local rank N: N modulo the GPUs visible)")
      .def_property_readonly("kind",
                             [](const device::DeviceRuntime& d) { return std::string(d.kind()); })
      .def_property_readonly(
          "stream",
          [](device::DeviceRuntime& d) -> py::object {
            const uintptr_t stream = device::cuda_stream_of(d);
            if (stream == 0) return py::none();
            return py::int_(stream);
          },
          "the cudaStream_t the device's work runs on (CUDA), or None (simulated)")
      .def(
          "to_device",
          [](const std::shared_ptr<device::DeviceRuntime>& d, const py::object& spec) {
            return capsule_of(moved(*d, spec, true));
          },
          py::arg("view"), "a device copy of a contiguous host tensor's view")
      .def(
          "to_host",
          [](const std::shared_ptr<device::DeviceRuntime>& d, const py::object& spec) {
            return capsule_of(moved(*d, spec, false));
          },
          py::arg("view"), "a host copy of a contiguous device tensor's view")
      .def(
          "record_on",
          [](const std::shared_ptr<device::DeviceRuntime>& d, uintptr_t stream) {
            return device::record_on_caller_stream(*d, stream, kPhase);
          },
          py::arg("stream"),
          "an event at the current end of the caller's stream (a cudaStream_t as an int), or "
          "None where the device has no streams of the caller's (simulated)")
      .def(
          "stream_wait",
          [](const std::shared_ptr<device::DeviceRuntime>& d,
             const std::shared_ptr<device::DeviceEvent>& event,
             uintptr_t stream) { return device::caller_stream_wait(*d, stream, event, kPhase); },
          py::arg("event"), py::arg("stream"),
          "makes the caller's stream (a cudaStream_t as an int) wait for `event` and returns "
          "True; False where the device has no streams of the caller's (simulated): wait on "
          "the host instead")
      .def(
          "synchronize", [](device::DeviceRuntime& d) { d.synchronize(kPhase, copy_timeout()); },
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace proxyep::python
