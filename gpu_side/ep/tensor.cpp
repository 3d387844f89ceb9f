#include "gpu_side/ep/tensor.hpp"

#include <fmt/format.h>

#include <cstring>
#include <new>

namespace proxyep::ep {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 2;
    case DType::fp8_e4m3:
      return 1;
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::boolean:
      return 1;
    case DType::u8:
      return 1;
  }
  return 1;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bf16";
    case DType::fp8_e4m3:
      return "float8_e4m3fn";
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::boolean:
      return "bool";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

TensorRef TensorRef::vector(const void* data, DType dtype, int64_t n) {
  return {data, dtype, Device::host, 1, n, 1, 1, 1};
}

TensorRef TensorRef::matrix(const void* data, DType dtype, int64_t rows, int64_t cols) {
  return {data, dtype, Device::host, 2, rows, cols, cols, 1};
}

TensorRef TensorRef::strided(const void* data, DType dtype, int64_t rows, int64_t cols,
                             int64_t row_stride, int64_t col_stride) {
  return {data, dtype, Device::host, 2, rows, cols, row_stride, col_stride};
}

std::string TensorRef::describe() const {
  if (!defined()) return "None";
  std::string shape = dims == 1 ? fmt::format("[{}]", rows) : fmt::format("[{}, {}]", rows, cols);
  std::string where = device == Device::cuda ? " (cuda)" : "";
  return fmt::format("{}{}{}", dtype_name(dtype), shape, where);
}

namespace {

constexpr size_t kAlignment = 64;

std::shared_ptr<std::byte[]> allocate(size_t bytes) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto* memory = static_cast<std::byte*>(
      ::operator new[](rounded == 0 ? kAlignment : rounded, std::align_val_t{kAlignment}));
  return std::shared_ptr<std::byte[]>(
      memory, [](std::byte* p) { ::operator delete[](p, std::align_val_t{kAlignment}); });
}

}  // namespace

Tensor Tensor::empty(DType dtype, int64_t rows) {
  Tensor t = empty(dtype, rows, 1);
  t.dims_ = 1;
  return t;
}

Tensor Tensor::empty(DType dtype, int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "tensor", "negative shape [{}, {}]", rows, cols);
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = 2;
  t.rows_ = rows;
  t.cols_ = cols;
  t.storage_ = allocate(t.bytes());
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(DType dtype, int64_t rows) {
  Tensor t = empty(dtype, rows);
  std::memset(t.data_, 0, t.bytes());
  return t;
}

Tensor Tensor::zeros(DType dtype, int64_t rows, int64_t cols) {
  Tensor t = empty(dtype, rows, cols);
  std::memset(t.data_, 0, t.bytes());
  return t;
}

Tensor Tensor::copy_of(const TensorRef& source) {
  require_defined(source, "tensor", "source");
  require_host(source, "tensor", "source");
  Tensor t = source.dims == 1 ? empty(source.dtype, source.rows)
                              : empty(source.dtype, source.rows, source.cols);
  size_t element = dtype_size(source.dtype);
  if (source.contiguous()) {
    std::memcpy(t.data_, source.data, t.bytes());
    return t;
  }
  const auto* from = static_cast<const std::byte*>(source.data);
  for (int64_t r = 0; r < source.rows; ++r)
    for (int64_t c = 0; c < source.cols; ++c)
      std::memcpy(
          t.data_ + static_cast<size_t>(r * source.cols + c) * element,
          from + static_cast<size_t>(r * source.row_stride + c * source.col_stride) * element,
          element);
  return t;
}

TensorRef Tensor::ref() const {
  if (!defined()) return {};
  return {data_, dtype_, Device::host, dims_, rows_, cols_, dims_ == 1 ? 1 : cols_, 1};
}

Tensor Tensor::clone() const {
  return defined() ? copy_of(ref()) : Tensor();
}

void require_defined(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.defined(), phase, "{} must be given; got None", name);
}

void require_dtype(const TensorRef& t, DType dtype, std::string_view phase, std::string_view name) {
  require_defined(t, phase, name);
  require(t.dtype == dtype, phase, "{} must have dtype {}; got {}", name, dtype_name(dtype),
          t.describe());
}

void require_shape(const TensorRef& t, int64_t rows, int64_t cols, std::string_view phase,
                   std::string_view name) {
  require_defined(t, phase, name);
  bool ok = cols < 0 ? (t.dims == 1 && t.rows == rows)
                     : (t.dims == 2 && t.rows == rows && t.cols == cols);
  require(ok, phase, "{} must have shape {}; got {}", name,
          cols < 0 ? fmt::format("[{}]", rows) : fmt::format("[{}, {}]", rows, cols), t.describe());
}

void require_contiguous(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.contiguous(), phase, "{} must be contiguous; got {} with strides ({}, {})", name,
          t.describe(), t.row_stride, t.col_stride);
}

void require_host(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.device == Device::host, phase,
          "{} is CUDA memory; this build's Buffer runs the CPU backend (host tensors)", name);
}

}  // namespace proxyep::ep
