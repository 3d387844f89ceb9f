// DeviceReleases: device memory handed to a caller (a deep_ep output torch holds) is freed only
// once the caller's stream has passed the point where the caller let it go.
//
// Why not a wait queued on the Buffer's stream (cudaStreamWaitEvent for the caller's point, the
// free behind it in stream order): a release runs at any moment (torch frees a tensor when its
// last reference goes), and a wait it queues stands before whatever the Buffer queues later.
// When the caller's stream itself waits for that later work (an async_finish call's completion
// point, event.current_stream_wait()), the two streams wait for each other until a deadline
// fails the call. So the storage is kept with the caller's point, and the host drops it once the
// point is reached, asked at the start of every call that hands out outputs (collect()); the
// free then follows the Buffer's own work in its stream's order. Only there: a release runs
// wherever torch frees a tensor, maybe while torch captures a graph in CUDA's global mode, where
// an event query from this process would invalidate the capture; the caller asks collect() only
// while its own stream is not being captured. When the last owner goes (the Buffer and all its
// outputs are gone: nothing can queue behind a wait any more), the Buffer's stream waits for the
// points still pending and their storage is freed behind those waits.
//
// While the Buffer's stream is captured into a graph, storage let go is dropped at once (no
// point is asked for), the runtime keeping memory freed during a capture for the graph's use
// (CudaDevice: for the stream's life).
//
// Threads: release() from any thread (torch's deleters), collect() from the Buffer's calling
// thread; both take one mutex.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace proxyep::integrations {

class DeviceReleases {
 public:
  explicit DeviceReleases(std::shared_ptr<gpu_side::device::DeviceRuntime> device)
      : device_(std::move(device)) {}
  // Has the device's stream wait for the points still pending (failures are logged), then drops
  // their storage: freed behind those waits.
  ~DeviceReleases();
  DeviceReleases(const DeviceReleases&) = delete;
  DeviceReleases& operator=(const DeviceReleases&) = delete;

  // Keeps `storage` until `point` (an event of the caller's stream; null: none, dropped now) is
  // reached. Asks the device nothing.
  void release(gpu_side::ep::Tensor storage,
               std::shared_ptr<gpu_side::device::DeviceEvent> point) noexcept;
  // Drops the storage whose points were reached (a point the device cannot answer for, a
  // failed device, counts as reached: logged). Only while no stream of the caller's is being
  // captured: the queries would invalidate a capture in CUDA's global mode.
  void collect() noexcept;
  size_t pending() const;

 private:
  struct Pending {
    gpu_side::ep::Tensor storage;
    std::shared_ptr<gpu_side::device::DeviceEvent> point;
  };
  bool reached(const Pending& pending) noexcept;

  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  mutable std::mutex mutex_;
  std::vector<Pending> pending_;
};

}  // namespace proxyep::integrations
