#include "tensor_bridge.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu_side/device/open_device.hpp"

#include <dlpack/dlpack.h>

#include <chrono>
#include <string>
#include <utility>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;

namespace proxyep::python {
namespace {

constexpr const char* kPhase = "python";

// The dtype names of view specs (proxyep/_tensors.py's _NAMES), both ways.
constexpr std::pair<std::string_view, ep::DType> kDTypeNames[] = {
    {"bf16", ep::DType::bf16}, {"fp8_e4m3", ep::DType::fp8_e4m3}, {"f32", ep::DType::f32},
    {"i32", ep::DType::i32},   {"i64", ep::DType::i64},           {"bool", ep::DType::boolean},
    {"u8", ep::DType::u8}};

ep::DType dtype_named(const std::string& name, std::string_view tensor) {
  for (const auto& [spelled, dtype] : kDTypeNames)
    if (name == spelled) return dtype;
  fail(kPhase, "{}: unsupported dtype {}", tensor, name);
}

std::string_view spec_name(ep::DType dtype) {
  for (const auto& [spelled, d] : kDTypeNames)
    if (d == dtype) return spelled;
  return "u8";
}

DLDataType dl_type(ep::DType dtype) {
  switch (dtype) {
    case ep::DType::bf16:
      return {kDLBfloat, 16, 1};
    case ep::DType::f32:
      return {kDLFloat, 32, 1};
    case ep::DType::i32:
      return {kDLInt, 32, 1};
    case ep::DType::i64:
      return {kDLInt, 64, 1};
    case ep::DType::fp8_e4m3:
    case ep::DType::boolean:
    case ep::DType::u8:
      return {kDLUInt, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

// What a capsule's DLManagedTensor owns: a handle on the storage (a runtime Tensor, or the Python
// object that owns borrowed memory), and the shape it describes.
struct Managed {
  ep::Tensor tensor;
  py::object owner;
  DeviceRelease release;  // device: order the storage's release after the caller's stream
  int64_t shape[2] = {0, 0};
  DLManagedTensor dl{};
};

// Hands the storage to the Buffer's releases with the point the caller's stream has reached
// (device_releases.hpp): freed once the caller's kernels queued so far, which may read it, have
// run. Runs wherever torch frees the tensor: it must not throw.
void order_release(Managed& m) noexcept {
  std::shared_ptr<gpu_side::device::DeviceEvent> point;
  try {
    // Freed while the caller's stream captures a graph (a tensor of an eager call dropped in
    // the captured code): an event recorded there would pull the Buffer's stream into the
    // capture. Released after the Buffer's own work only, as in C++. Nor is a point asked for
    // while the Buffer's stream is captured (joined to the caller's capture).
    if (!m.release.device->capturing()) {
      gpu_side::device::require_no_graph_capture(*m.release.device, m.release.caller_stream,
                                                 "python(release)");
      point = gpu_side::device::record_on_caller_stream(*m.release.device, m.release.caller_stream,
                                                        "python(release)");
    }
  } catch (const std::exception& e) {
    log::debug("python: a device tensor's release not ordered after the caller's stream: {}",
               e.what());
  }
  if (m.release.releases) m.release.releases->release(std::move(m.tensor), std::move(point));
}

void delete_managed(DLManagedTensor* dl) {
  auto* m = static_cast<Managed*>(dl->manager_ctx);
  if (m->release.device) order_release(*m);
  if (!m->owner) {
    delete m;
    return;
  }
  py::gil_scoped_acquire gil;  // torch may free a tensor on a thread without the GIL
  delete m;
}

// A capsule torch never consumed (renamed "used_dltensor" when it does) frees its tensor here.
void delete_unconsumed(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor") == 0) return;
  auto* dl = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (dl != nullptr && dl->deleter != nullptr) dl->deleter(dl);
}

// `t` in device memory when the spec says so.
ep::TensorRef placed(ep::TensorRef t, const py::handle& on_device) {
  if (on_device.cast<bool>()) t.device = ep::Device::cuda;
  return t;
}

}  // namespace

ep::TensorRef view_of(const py::handle& spec, std::string_view name) {
  if (spec.is_none()) return {};
  auto t = spec.cast<py::tuple>();
  require(t.size() == 5, kPhase, "{}: malformed tensor view", name);
  const auto data = reinterpret_cast<const void*>(t[0].cast<uintptr_t>());
  const ep::DType dtype = dtype_named(t[1].cast<std::string>(), name);
  auto shape = t[2].cast<py::tuple>();
  auto strides = t[3].cast<py::tuple>();
  if (shape.size() == 1) {
    const auto n = shape[0].cast<int64_t>();
    require(n <= 1 || strides[0].cast<int64_t>() == 1, kPhase,
            "{} must be contiguous (a 1-D tensor with stride {})", name,
            strides[0].cast<int64_t>());
    return placed(ep::TensorRef::vector(data, dtype, n), t[4]);
  }
  require(shape.size() == 2, kPhase, "{} must have 1 or 2 dimensions here; got {}", name,
          shape.size());
  return placed(
      ep::TensorRef::strided(data, dtype, shape[0].cast<int64_t>(), shape[1].cast<int64_t>(),
                             strides[0].cast<int64_t>(), strides[1].cast<int64_t>()),
      t[4]);
}

py::object spec_of(const ep::TensorRef& t) {
  if (!t.defined()) return py::none();
  const auto data = reinterpret_cast<uintptr_t>(t.data);
  const py::tuple shape = t.dims == 1 ? py::make_tuple(t.rows) : py::make_tuple(t.rows, t.cols);
  const py::tuple strides =
      t.dims == 1 ? py::make_tuple(1) : py::make_tuple(t.row_stride, t.col_stride);
  return py::make_tuple(data, spec_name(t.dtype), shape, strides, t.device == ep::Device::cuda);
}

namespace {

// Where torch must place a tensor over `data`: host memory, the simulated device's (host memory
// too) and memory CUDA does not know are the CPU's; CUDA device memory is its GPU's.
DLDevice dl_device(const void* data, ep::Device device) {
  if (device == ep::Device::host) return {kDLCPU, 0};
  const int gpu = gpu_side::device::cuda_device_of(data);
  return gpu < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, gpu};
}

// A capsule over `m`'s storage at `data`, of `dims` dimensions (m->shape) and `dtype`.
py::object capsule_over(Managed* m, void* data, int dims, ep::DType dtype, ep::Device device) {
  DLTensor& t = m->dl.dl_tensor;
  t.data = data;
  t.device = dl_device(data, device);
  t.ndim = dims;
  t.dtype = dl_type(dtype);
  t.shape = m->shape;
  t.strides = nullptr;  // compact, row-major
  t.byte_offset = 0;
  m->dl.manager_ctx = m;
  m->dl.deleter = delete_managed;
  PyObject* capsule = PyCapsule_New(&m->dl, "dltensor", delete_unconsumed);
  if (capsule == nullptr) {
    delete m;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace

py::object capsule_of(const ep::Tensor& tensor, const DeviceRelease* release) {
  if (!tensor.defined()) return py::none();
  auto* m = new Managed;
  m->tensor = tensor;
  if (release != nullptr && tensor.device() == ep::Device::cuda) m->release = *release;
  m->shape[0] = tensor.rows();
  m->shape[1] = tensor.cols();
  return capsule_over(m, const_cast<std::byte*>(m->tensor.raw()), tensor.dims(), tensor.dtype(),
                      tensor.device());
}

py::object capsule_of_bytes(std::span<std::byte> bytes, py::object owner) {
  auto* m = new Managed;
  m->owner = std::move(owner);
  m->shape[0] = static_cast<int64_t>(bytes.size());
  return capsule_over(m, bytes.data(), 1, ep::DType::u8, ep::Device::host);
}

}  // namespace proxyep::python
