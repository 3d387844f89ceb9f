// DeviceBackend: the RowBackend (row_backend.hpp) for device tensors. Every row operation is a
// kernel (or a copy) on a DeviceRuntime (gpu_side/device/device_runtime.hpp): CUDA on a GPU, the
// host-simulated device in CI, the same code above the interface either way.
//
// What it adds to the kernels:
// - Uploads. The protocols steer the work with host arrays (token lists, send_head, the
//   combine's per-rank tables, RowBackend's memory rule); a kernel reads device addresses only,
//   so each call copies those arrays into device scratch first (nested tables are rebuilt with
//   the device addresses of their parts).
// - Validation on the host. get_dispatch_layout copies topk_idx back once to check it as the
//   host path does (an expert id out of range would make the kernel write out of bounds).
// - Completion. Every call only queues its work on the device's stream and returns; a mark is
//   an event recorded on the stream (none when nothing was queued since the last), reached()
//   asks it without blocking, wait() blocks for at most ep.timeout_ms. So the kernels of one
//   chunk run while the host posts the chunk before it, and the host waits only where it hands
//   bytes on (RowBackend's completion rule). The uploads' memory is held until a mark after
//   them is reached. A Buffer's calls use the backend from the caller's thread and from the
//   communication stream's, so its state is locked.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/backend/row_backend.hpp"

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace proxyep::integrations {

class DeviceBackend final : public RowBackend {
 public:
  explicit DeviceBackend(std::shared_ptr<gpu_side::device::DeviceRuntime> device);

  gpu_side::device::DeviceRuntime& device() { return *device_; }
  std::shared_ptr<gpu_side::device::DeviceRuntime> stream() const override { return device_; }

  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows, int64_t cols) override;
  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows) override;
  gpu_side::ep::DispatchLayout layout(const gpu_side::ep::TensorRef& topk_idx,
                                      const gpu_side::ep::EpShape& shape) override;
  void pack_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                 std::span<const int32_t> tokens) override;
  void place_routed_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                         const TokenRoutes& routes) override;
  void copy_rows(std::byte* to, const std::byte* from, int64_t rows, uint64_t row_bytes) override;
  void copy_runs(std::span<const gpu_side::ep::CopyRun> runs) override;
  void fill(std::byte* to, uint8_t value, uint64_t bytes) override;
  void reduce(const gpu_side::ep::CombineInput& input, int64_t num_tokens) override;
  void write(std::byte* to, const void* from, uint64_t bytes) override;
  void add(const gpu_side::ep::TensorRef& to, std::span<const int32_t> values) override;
  void add(const gpu_side::ep::TensorRef& to, std::span<const int64_t> values) override;
  void ll_pack(const gpu_side::ep::LlFormat& format, const gpu_side::ep::TensorRef& x,
               std::span<const gpu_side::ep::LlPackItem> items) override;
  LlRouting ll_route(const gpu_side::ep::TensorRef& topk_idx, int32_t experts) override;
  void ll_pack_routed(const gpu_side::ep::LlFormat& format, const gpu_side::ep::TensorRef& x,
                      const LlRouting& routing, int32_t local_experts,
                      std::span<std::byte* const> slots) override;
  void ll_unpack_counted(const gpu_side::ep::LlFormat& format, std::span<const int32_t> counts,
                         std::span<const std::byte* const> from,
                         std::span<const gpu_side::ep::LlExpertSink> sinks, int64_t rows_per_expert,
                         int32_t* recv_count, int64_t* layout_range) override;
  void ll_combine(std::span<const uint16_t* const> rows, const float* weights, uint16_t* out,
                  int topk, uint32_t hidden) override;
  void ll_combine_routed(const LlRouting& routing, int32_t local_experts,
                         std::span<const uint16_t* const> from, const float* weights, uint16_t* out,
                         uint32_t hidden) override;
  int64_t count_mismatches(const int64_t* a, const int64_t* b, int64_t count,
                           std::string_view phase) override;

  Mark mark() override;
  bool reached(Mark mark, std::string_view phase) override;
  void wait(Mark mark, std::string_view phase) override;

 private:
  // A device copy of the `count` values at `host` as they are now, held until the next mark is
  // reached. Locked.
  template <typename T>
  const T* upload(const T* host, size_t count);
  // A host copy of `bytes` at `host` as they are now (a copy's source), held likewise. Locked.
  const std::byte* stage(const void* host, size_t bytes);
  template <typename T>
  void add_values(const gpu_side::ep::TensorRef& to, std::span<const T> values);
  // After queueing work. Locked.
  void queued() { queued_ = true; }
  // Marks up to `mark` are reached: drops their events and the uploads before them. Locked.
  void passed(Mark mark);

  struct Upload {
    Mark before;                          // the first mark after it
    std::shared_ptr<std::byte[]> device;  // the copy the kernels read (none: staged only)
    std::vector<std::byte> host;          // what it is copied from
  };
  struct Recorded {
    Mark mark;
    std::shared_ptr<gpu_side::device::DeviceEvent> event;
  };

  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::mutex mutex_;
  std::deque<Upload> uploads_;    // oldest first
  std::deque<Recorded> pending_;  // marks not yet known reached, in stream order
  Mark last_ = 0;                 // the newest mark handed out
  Mark done_ = 0;                 // every mark up to this one is reached
  bool queued_ = false;           // work queued since mark last_
};

}  // namespace proxyep::integrations
