// Tensors as the EP layer sees them: host (or, later, CUDA) memory with a dtype and a 1-D or 2-D
// shape. `Tensor` owns contiguous storage (what Buffer returns); `TensorRef` is a non-owning,
// possibly strided view of the caller's memory (what Buffer takes: a PyTorch tensor's data
// pointer, shape and strides map onto it one to one, e.g. column-major FP8 scales).
//
// Shapes and strides are in elements, like PyTorch's. A 1-D tensor has cols() == 1 and
// dims() == 1. Validation helpers throw proxyep::Error naming the argument, so bad input is
// reported before anything is sent.
#pragma once

#include "common/error.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace proxyep::gpu_side::ep {

enum class DType : uint8_t { bf16, fp8_e4m3, f32, i32, i64, boolean, u8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);

enum class Device : uint8_t { host, cuda };

class Tensor;

// Non-owning view. An undefined view (data == nullptr and rows == 0) stands for "None".
struct TensorRef {
  const void* data = nullptr;
  DType dtype = DType::u8;
  Device device = Device::host;
  int dims = 0;  // 0 = undefined, 1 or 2
  int64_t rows = 0, cols = 1;
  int64_t row_stride = 0, col_stride = 1;  // elements

  bool defined() const { return dims != 0; }
  static TensorRef vector(const void* data, DType dtype, int64_t n);
  static TensorRef matrix(const void* data, DType dtype, int64_t rows, int64_t cols);
  static TensorRef strided(const void* data, DType dtype, int64_t rows, int64_t cols,
                           int64_t row_stride, int64_t col_stride);
  bool contiguous() const { return dims == 1 || (col_stride == 1 && row_stride == cols); }
  int64_t numel() const { return dims == 0 ? 0 : rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  // Element (r, c) of a strided view, for the few places that honour strides.
  template <typename T>
  const T& at(int64_t r, int64_t c) const {
    return static_cast<const T*>(data)[r * row_stride + c * col_stride];
  }
  std::string describe() const;  // "bf16[4096, 7168]" / "None"
};

// Owning, contiguous memory: host memory (64-byte aligned) from the factories, or whatever
// over() is given, device memory included. Copies share the storage (like torch.Tensor
// handles); clone() copies the bytes (host tensors only).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, int64_t rows);                // 1-D
  static Tensor empty(DType dtype, int64_t rows, int64_t cols);  // 2-D
  static Tensor zeros(DType dtype, int64_t rows);
  static Tensor zeros(DType dtype, int64_t rows, int64_t cols);
  static Tensor copy_of(const TensorRef& source);  // contiguous copy of any view
  // A tensor over `storage`, memory someone else allocated: its deleter runs when the last
  // handle is dropped (e.g. an output block in memory the node's ranks share, or device memory
  // from a DeviceRuntime, with device = cuda). cols < 0: a 1-D tensor of `rows`.
  static Tensor over(std::shared_ptr<std::byte[]> storage, DType dtype, int64_t rows, int64_t cols,
                     Device device = Device::host);

  bool defined() const { return dims_ != 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int dims() const { return dims_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::byte* raw() { return data_; }
  const std::byte* raw() const { return data_; }
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(data_);
  }
  TensorRef ref() const;
  operator TensorRef() const { return ref(); }  // NOLINT: a tensor is usable wherever a view is
  Tensor clone() const;
  // Handles sharing this tensor's storage, this one included (0 when undefined): a pool may
  // reuse storage only it still holds.
  long use_count() const { return storage_.use_count(); }

 private:
  std::shared_ptr<std::byte[]> storage_;
  std::byte* data_ = nullptr;
  DType dtype_ = DType::u8;
  Device device_ = Device::host;
  int dims_ = 0;
  int64_t rows_ = 0, cols_ = 1;
};

// Argument checks: each throws proxyep::Error(phase, "<name> must ...; got <describe()>").
void require_defined(const TensorRef& t, std::string_view phase, std::string_view name);
void require_dtype(const TensorRef& t, DType dtype, std::string_view phase, std::string_view name);
void require_shape(const TensorRef& t, int64_t rows, int64_t cols, std::string_view phase,
                   std::string_view name);  // cols < 0: a 1-D tensor of `rows`
void require_contiguous(const TensorRef& t, std::string_view phase, std::string_view name);
void require_host(const TensorRef& t, std::string_view phase, std::string_view name);
// Device memory when `on_device` (the call's backend is a device's), else host memory.
void require_place(const TensorRef& t, bool on_device, std::string_view phase,
                   std::string_view name);

}  // namespace proxyep::gpu_side::ep

// Lets checks pass a TensorRef itself as a message argument (require(ok, phase, "... {}", x)):
// it is described only when the message is made, not on every successful check.
template <>
struct fmt::formatter<proxyep::gpu_side::ep::TensorRef> : fmt::formatter<std::string_view> {
  auto format(const proxyep::gpu_side::ep::TensorRef& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(t.describe(), ctx);
  }
};
