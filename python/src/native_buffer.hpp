// What _proxyep.Buffer wraps: proxyep::Buffer with the bootstrap it was made over, and the
// stream bookkeeping every call of either mode needs around it (the caller's previous_event,
// a captured call's join back, how device outputs are released). buffer_binding.cpp binds its
// construction and lifecycle; normal_binding.cpp and low_latency_binding.cpp bind its calls.
#pragma once

#include "tensor_bridge.hpp"

#include "control/bootstrap.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "integrations/buffer.hpp"
#include "integrations/device_releases.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

namespace proxyep::python {

using DeviceEventPtr = std::shared_ptr<gpu_side::device::DeviceEvent>;

// What the Python side learnt from its group: where rank 0 of the group listens, this rank's
// place, and the per-Buffer job id and secret that keep strangers out of the rendezvous.
struct GroupRendezvous {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int ranks_per_node = 1;
  std::string job_id;
  std::string secret;  // raw bytes
};

// A Buffer with the bootstrap it was made over (the Buffer must go first).
class NativeBuffer {
 public:
  // Collective: waits for every rank of `group`. `interrupt` checks Python's signals meanwhile.
  NativeBuffer(const GroupRendezvous& group, const BufferOptions& options,
               std::function<void()> interrupt);
  ~NativeBuffer() { close(); }

  Buffer& get();
  // Collective over the Buffer's bootstrap: what the C++ benches time from, so that
  // python3 -m proxyep.bench compares like with like (a gloo barrier releases ranks less evenly).
  void barrier();
  // Frees the Buffer and the bootstrap (not collective; destroy() is).
  void close();

  // A device call's previous_event: the caller's, else (DeepEP's default: the Buffer's stream
  // waits for the caller's) the point `caller_stream` has reached, where the device has streams
  // of the caller's (CUDA; the simulated device's callers work on the host). A host call takes
  // none: the host waits for the caller's event first (its tensors may be what that stream
  // made; the GIL released meanwhile).
  // `capturable` (the low-latency calls): while the caller's stream captures a CUDA graph, the
  // point recorded there is inside the capture, and the Buffer's stream joins it (join_back()
  // after the call); other calls are refused there.
  DeviceEventPtr previous_event(std::string_view call,
                                std::initializer_list<gpu_side::ep::TensorRef> tensors,
                                DeviceEventPtr given, uintptr_t caller_stream,
                                bool capturable = false) const;
  // A captured call's end (its event, a point inside the graph): the caller's stream waits for
  // it, joining the Buffer's stream back into the capture, which can then end. Nothing for a
  // call that was not captured.
  void join_back(const CallEvent& event, uintptr_t caller_stream, std::string_view call) const;
  // How the call's device outputs are released: after `caller_stream`'s reads of them. Drops,
  // first, the earlier outputs whose readers are done, unless the caller's stream is being
  // captured (an event query would invalidate the capture).
  DeviceRelease release(uintptr_t caller_stream) const;

 private:
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  // Outputs torch let go, until the streams that read them passed that point; shared with the
  // outputs themselves, which may outlive this Buffer.
  std::shared_ptr<integrations::DeviceReleases> releases_;
  std::unique_ptr<control::Bootstrap> boot_;
  std::unique_ptr<Buffer> buffer_;
};

}  // namespace proxyep::python
