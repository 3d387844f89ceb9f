#include "native_buffer.hpp"

#include "common/crypto.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/open_device.hpp"

#include <chrono>
#include <span>

namespace py = pybind11;
namespace ep = proxyep::gpu_side::ep;

namespace proxyep::python {
namespace {

// The bootstrap's options for `group`: the launch environment it describes, with the job id and
// secret that only this Buffer's ranks know.
control::Bootstrap::Options bootstrap_options(const GroupRendezvous& group) {
  control::LaunchEnv env;
  env.master_addr = group.master_addr;
  env.master_port = group.master_port;
  env.rank = group.rank;
  env.world_size = group.world_size;
  env.local_world_size = group.ranks_per_node;
  env.local_rank = group.rank % group.ranks_per_node;
  env.validate();
  auto options = control::Bootstrap::options_for(env);
  options.job_id = group.job_id;
  if (!group.secret.empty()) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(group.secret.data());
    options.secret =
        std::make_shared<const SecretBytes>(std::span<const uint8_t>(bytes, group.secret.size()));
  }
  return options;
}

}  // namespace

NativeBuffer::NativeBuffer(const GroupRendezvous& group, const BufferOptions& options,
                           std::function<void()> interrupt)
    : device_(options.device),
      releases_(device_ ? std::make_shared<integrations::DeviceReleases>(device_) : nullptr) {
  auto boot_options = bootstrap_options(group);
  boot_options.progress = std::move(interrupt);
  boot_ = control::Bootstrap::connect(std::move(boot_options));
  buffer_ = std::make_unique<Buffer>(*boot_, options);
  // Later collectives (barrier, destroy) may run on any thread, late in the interpreter's life.
  boot_->set_progress({});
}

Buffer& NativeBuffer::get() {
  require(buffer_ != nullptr, "buffer", "the Buffer was destroyed");
  return *buffer_;
}

void NativeBuffer::barrier() {
  require(boot_ != nullptr, "buffer", "the Buffer was destroyed");
  boot_->barrier("python(barrier)");
}

void NativeBuffer::close() {
  buffer_.reset();
  boot_.reset();
}

DeviceEventPtr NativeBuffer::previous_event(std::string_view call,
                                            std::initializer_list<ep::TensorRef> tensors,
                                            DeviceEventPtr given, uintptr_t caller_stream,
                                            bool capturable) const {
  bool on_device = false;
  for (const auto& t : tensors)
    on_device = on_device || t.device == ep::Device::cuda;
  if (!on_device) {
    if (given && device_) {
      py::gil_scoped_release unlocked;
      device_->wait_for(*given, "previous_event",
                        std::chrono::milliseconds(params::ep_timeout_ms.get()));
    }
    return nullptr;
  }
  if (!device_) return given;
  if (!given)
    return gpu_side::device::record_on_caller_stream(*device_, caller_stream, call, capturable);
  // Ordering after the given event alone: the caller's stream is still checked for capture.
  if (!capturable) gpu_side::device::require_no_graph_capture(*device_, caller_stream, call);
  return given;
}

void NativeBuffer::join_back(const CallEvent& event, uintptr_t caller_stream,
                             std::string_view call) const {
  const DeviceEventPtr& point = event.device_point();
  if (device_ && point && point->captured())
    gpu_side::device::caller_stream_wait(*device_, caller_stream, point, call);
}

DeviceRelease NativeBuffer::release(uintptr_t caller_stream) const {
  if (releases_) {
    try {
      gpu_side::device::require_no_graph_capture(*device_, caller_stream, "python(release)");
      releases_->collect();
    } catch (const Error&) {
      // captured: collected at a later call
    }
  }
  return {device_, caller_stream, releases_};
}

}  // namespace proxyep::python
