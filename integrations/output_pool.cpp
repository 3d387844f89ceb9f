// OutputSlots (output_pool.hpp).
#include "integrations/output_pool.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

namespace {

bool free_slot(const ep::Tensor& t) {
  return !t.defined() || t.use_count() == 1;
}

bool has_form(const ep::Tensor& t, ep::DType dtype, int64_t rows, int64_t cols) {
  return t.dtype() == dtype && t.rows() == rows && (cols < 0 ? t.dims() == 1 : t.cols() == cols);
}

}  // namespace

ep::Tensor OutputSlots::take(RowBackend& backend, ep::DType dtype, int64_t rows, int64_t cols) {
  for (const ep::Tensor& t : slots_)
    if (t.defined() && free_slot(t) && has_form(t, dtype, rows, cols)) return t;
  ep::Tensor fresh = cols < 0 ? backend.allocate(dtype, rows) : backend.allocate(dtype, rows, cols);
  for (ep::Tensor& t : slots_)
    if (free_slot(t)) {
      t = fresh;
      break;
    }
  return fresh;
}

}  // namespace proxyep::integrations
