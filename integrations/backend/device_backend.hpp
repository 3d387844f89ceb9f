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
// - Completion. RowBackend promises every call's work is done when it returns (the protocols
//   then publish the rows to their peers), so each call ends with a synchronize() bounded by
//   ep.timeout_ms. (Overlapping them on the communication stream is the next step.)
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/backend/row_backend.hpp"

#include <memory>
#include <vector>

namespace proxyep::integrations {

class DeviceBackend final : public RowBackend {
 public:
  explicit DeviceBackend(std::shared_ptr<gpu_side::device::DeviceRuntime> device);

  gpu_side::device::DeviceRuntime& device() { return *device_; }

  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows, int64_t cols) override;
  gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows) override;
  gpu_side::ep::DispatchLayout layout(const gpu_side::ep::TensorRef& topk_idx,
                                      const gpu_side::ep::EpShape& shape) override;
  void pack_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                 std::span<const int32_t> tokens) override;
  void place_routed_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                         const TokenRoutes& routes) override;
  void copy_rows(std::byte* to, const std::byte* from, int64_t rows, uint64_t row_bytes) override;
  void fill(std::byte* to, uint8_t value, uint64_t bytes) override;
  void reduce(const gpu_side::ep::CombineInput& input, int64_t num_tokens) override;

 private:
  // A device copy of the `count` values at `host` as they are now, alive until finish().
  template <typename T>
  const T* upload(const T* host, size_t count);
  // Waits for the queued work (ep.timeout_ms), then drops the scratch.
  void finish(std::string_view phase);

  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::vector<std::shared_ptr<std::byte[]>> scratch_;  // device copies of the uploads
  std::vector<std::vector<std::byte>> host_scratch_;   // what they are copied from
};

}  // namespace proxyep::integrations
