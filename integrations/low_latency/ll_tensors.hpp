// The few tensor accesses the LL calls need beyond gpu_side/ep/tensor.hpp: element i of a 1-D
// view the caller lets the call write (statistics, `out`), and the argument checks LL shares.
#pragma once

#include "gpu_side/ep/tensor.hpp"

#include <cstdint>
#include <string_view>

namespace proxyep::integrations::low_latency {

// Element i of a 1-D view that the call may write (DeepEP's in-place statistics).
template <typename T>
T& written_at(const gpu_side::ep::TensorRef& t, int64_t i) {
  return const_cast<T&>(t.at<T>(i, 0));
}

// A tensor of `dtype` and shape [rows] (cols < 0) or [rows, cols], in device memory when
// `on_device` (else host memory); `contiguous` when the call reads it as one block. Throws
// proxyep::Error(phase) naming `name`.
inline void check_tensor(const gpu_side::ep::TensorRef& t, gpu_side::ep::DType dtype, int64_t rows,
                         int64_t cols, bool contiguous, std::string_view phase,
                         std::string_view name, bool on_device = false) {
  gpu_side::ep::require_defined(t, phase, name);
  gpu_side::ep::require_place(t, on_device, phase, name);
  gpu_side::ep::require_dtype(t, dtype, phase, name);
  gpu_side::ep::require_shape(t, rows, cols, phase, name);
  if (contiguous) gpu_side::ep::require_contiguous(t, phase, name);
}

}  // namespace proxyep::integrations::low_latency
