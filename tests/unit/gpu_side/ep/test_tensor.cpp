#include "gpu_side/ep/tensor.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

TEST_CASE("tensor: shapes, copies and argument checks") {
  Tensor t = Tensor::zeros(DType::f32, 3, 4);
  CHECK(t.dims() == 2);
  CHECK(t.bytes() == 48);
  t.data<float>()[5] = 2.5f;
  Tensor c = t.clone();
  t.data<float>()[5] = 0.f;
  CHECK(c.data<float>()[5] == 2.5f);
  // A column-major view copied to contiguous storage.
  float cm[6] = {0, 1, 2, 3, 4, 5};  // 3 rows x 2 cols, column-major
  Tensor r = Tensor::copy_of(TensorRef::strided(cm, DType::f32, 3, 2, 1, 3));
  CHECK(r.data<float>()[1] == 3.f);
  CHECK(r.data<float>()[2] == 1.f);
  CHECK_THROWS_WITH_AS(require_dtype(t.ref(), DType::bf16, "dispatch", "x"),
                       doctest::Contains("x must have dtype bf16; got float32[3, 4]"), Error);
  CHECK_THROWS_WITH_AS(require_shape(t.ref(), 3, 5, "dispatch", "x"), doctest::Contains("[3, 5]"),
                       Error);
  CHECK_THROWS_AS(require_defined(TensorRef{}, "dispatch", "x"), Error);
}
