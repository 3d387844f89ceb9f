// OutputPool: the output tensors of a Buffer's earlier calls, reused once nobody else holds them.
// Why: a fresh large allocation costs a page fault and the kernel's zeroing for every page the
// call then writes, and DeepEP-sized outputs (tens of MB: always mmap'd by malloc, so freed back
// to the kernel each call) make that as costly as the copy into them. A pooled tensor is reused
// only when the pool holds its last reference (the caller dropped it and no call in flight
// writes it) and its form is the one asked for; every caller of the pool writes every element
// it returns, so stale contents never show.
//
// Each kind of output has its own slots (two: a caller that keeps the previous call's outputs
// while the next call runs, DeepEP's double buffering, still gets reuse).
#pragma once

#include "gpu_side/ep/tensor.hpp"
#include "integrations/backend/row_backend.hpp"

#include <array>
#include <cstdint>

namespace proxyep::integrations {

class OutputSlots {
 public:
  // A free pooled tensor of this form, else a new one (kept in a free slot if there is one).
  // cols < 0: a 1-D tensor of `rows` elements.
  gpu_side::ep::Tensor take(RowBackend& backend, gpu_side::ep::DType dtype, int64_t rows,
                            int64_t cols);

 private:
  std::array<gpu_side::ep::Tensor, 2> slots_;
};

}  // namespace proxyep::integrations
