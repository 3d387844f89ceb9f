// Host copies of device tensors and back (device_staging.hpp).
#include "integrations/device_staging.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <chrono>
#include <mutex>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

namespace {

// Elements from a tensor's first to its last, as its strides lay them out.
int64_t extent(const ep::TensorRef& t, std::string_view phase) {
  require(t.row_stride >= 0 && t.col_stride >= 0, phase,
          "device tensors with negative strides are not supported; got {}", t);
  if (t.numel() == 0) return 0;
  return (t.rows - 1) * t.row_stride + (t.dims == 2 ? (t.cols - 1) * t.col_stride : 0) + 1;
}

}  // namespace

DeviceStaging::DeviceStaging(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                             std::string_view phase)
    : device_(std::move(device)), phase_(phase) {}

void order_after(gpu_side::device::DeviceRuntime& device,
                 const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  if (event) device.wait_event(event, std::chrono::milliseconds(params::ep_timeout_ms.get()));
}

void DeviceStaging::order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  integrations::order_after(*device_, event);
}

ep::TensorRef DeviceStaging::host_view(const ep::TensorRef& t, bool zeroed) {
  if (!t.defined()) return t;
  const int64_t elements = extent(t, phase_);
  ep::Tensor host =
      zeroed ? ep::Tensor::zeros(t.dtype, elements) : ep::Tensor::empty(t.dtype, elements);
  ep::TensorRef view = t;
  view.data = host.raw();
  view.device = ep::Device::host;
  held_.push_back(std::move(host));
  return view;
}

ep::TensorRef DeviceStaging::to_host(const ep::TensorRef& t) {
  const ep::TensorRef view = host_view(t, false);
  if (t.defined()) device_->copy(held_.back().raw(), t.data, held_.back().bytes());
  return view;
}

// The caller handed these tensors over for writing, as the host path's in-place outputs are.
ep::TensorRef DeviceStaging::in_out(const ep::TensorRef& t) {
  const ep::TensorRef view = to_host(t);
  if (t.defined()) write_backs_.push_back({const_cast<void*>(t.data), held_.back(), false});
  return view;
}

ep::TensorRef DeviceStaging::accumulate(const ep::TensorRef& t) {
  const ep::TensorRef view = host_view(t, true);
  if (t.defined()) {
    require(t.dtype == ep::DType::i32 || t.dtype == ep::DType::i64, phase_,
            "a statistics tensor must be int32 or int64; got {}", t);
    write_backs_.push_back({const_cast<void*>(t.data), held_.back(), true});
  }
  return view;
}

namespace {

template <typename T>
void add_into(ep::Tensor& values, const ep::Tensor& delta) {
  for (int64_t i = 0; i < values.rows(); ++i)
    values.data<T>()[i] += delta.data<T>()[i];
}

}  // namespace

void DeviceStaging::write_back() {
  for (const WriteBack& w : write_backs_) {
    if (!w.add) {
      device_->copy(w.device, w.host.raw(), w.host.bytes());
      continue;
    }
    // Read, add, write: calls finish one at a time (the stream settles before a hook's).
    // The strides' gaps hold zeros in the delta, so adding over the whole extent leaves them be.
    ep::Tensor values = ep::Tensor::empty(w.host.dtype(), w.host.rows());
    device_->copy(values.raw(), w.device, values.bytes());
    wait();
    if (values.dtype() == ep::DType::i32)
      add_into<int32_t>(values, w.host);
    else
      add_into<int64_t>(values, w.host);
    device_->copy(w.device, values.raw(), values.bytes());
    held_.push_back(std::move(values));
  }
}

ep::Tensor DeviceStaging::device_like(const ep::Tensor& host) {
  if (!host.defined()) return {};
  return ep::Tensor::over(device_->allocate(host.bytes()), host.dtype(), host.rows(),
                          host.dims() == 1 ? -1 : host.cols(), ep::Device::cuda);
}

void DeviceStaging::upload(ep::Tensor device, const ep::Tensor& host) {
  if (!host.defined()) return;
  device_->copy(device.raw(), host.raw(), host.bytes());
  held_.push_back(host);
}

StagedOutput DeviceStaging::move_to_device(ep::Tensor& output) {
  StagedOutput staged{device_like(output), output};
  output = staged.device;
  return staged;
}

void DeviceStaging::wait() {
  device_->synchronize(phase_, std::chrono::milliseconds(params::ep_timeout_ms.get()));
}

void finish_on_device(CommStream& stream, const std::shared_ptr<DeviceStaging>& staging,
                      std::vector<StagedOutput> outputs, RecvHook& hook, CallEvent& event) {
  auto finish = [staging, outputs = std::move(outputs)] {
    for (const StagedOutput& o : outputs)
      staging->upload(o.device, o.host);
    staging->write_back();
    staging->wait();
  };
  if (hook.defined()) {
    stream.submit([staging] {});
    auto once = std::make_shared<std::once_flag>();
    hook = RecvHook([receive = hook, finish = std::move(finish), once] {
      receive();
      std::call_once(*once, finish);
    });
  } else if (event.defined()) {
    // Stream order: it runs after the call's task; settling rethrows that task's failure first.
    event = stream.event_for(stream.submit(std::move(finish)));
  } else {
    finish();
  }
}

}  // namespace proxyep::integrations
