#include "gpu_side/ep/tensor.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace proxyep::gpu_side::ep {

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

// Large blocks are cached, the way PyTorch's caching allocator does it: a dispatch returns
// tensors of hundreds of MB each call, and fresh memory of that size comes straight from mmap,
// so every call would otherwise pay a page fault per 4 KiB page (that alone doubled a dispatch's
// time here). Blocks of at least kCachedMin are rounded up to 2 MiB and kept on free, up to
// kCacheLimit bytes in all; a request takes a cached block of exactly its rounded size.
constexpr size_t kCachedMin = size_t{1} << 20;
constexpr size_t kCacheGranule = size_t{2} << 20;
constexpr size_t kCacheLimit = size_t{1} << 30;

class BlockCache {
 public:
  std::byte* take(size_t bytes) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    std::byte* block = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return block;
  }
  // False when the cache is full: the caller frees the block.
  bool give(std::byte* block, size_t bytes) {
    std::lock_guard lock(mutex_);
    if (cached_ + bytes > kCacheLimit) return false;
    free_.emplace(bytes, block);
    cached_ += bytes;
    return true;
  }
  ~BlockCache() {
    for (auto& [bytes, block] : free_)
      ::operator delete[](block, std::align_val_t{kAlignment});
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, std::byte*> free_;
  size_t cached_ = 0;
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache();  // leaked: tensors may outlive static destruction
  return *cache;
}

std::shared_ptr<std::byte[]> allocate(size_t bytes) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  const bool cached = rounded >= kCachedMin;
  if (cached) rounded = (rounded + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
  std::byte* memory = cached ? block_cache().take(rounded) : nullptr;
  if (memory == nullptr)
    memory = static_cast<std::byte*>(::operator new[](rounded, std::align_val_t{kAlignment}));
  return std::shared_ptr<std::byte[]>(memory, [rounded, cached](std::byte* p) {
    if (!cached || !block_cache().give(p, rounded))
      ::operator delete[](p, std::align_val_t{kAlignment});
  });
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

Tensor Tensor::over(std::shared_ptr<std::byte[]> storage, DType dtype, int64_t rows, int64_t cols,
                    Device device) {
  const bool vector = cols < 0;
  if (vector) cols = 1;
  require(rows >= 0, "tensor", "negative shape [{}, {}]", rows, cols);
  require(storage != nullptr || rows * cols == 0, "tensor", "no storage for [{}, {}]", rows, cols);
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.dims_ = vector ? 1 : 2;
  t.rows_ = rows;
  t.cols_ = cols;
  t.storage_ = std::move(storage);
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
  return {data_, dtype_, device_, dims_, rows_, cols_, dims_ == 1 ? 1 : cols_, 1};
}

Tensor Tensor::clone() const {
  return defined() ? copy_of(ref()) : Tensor();
}

void require_defined(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.defined(), phase, "{} must be given; got None", name);
}

void require_dtype(const TensorRef& t, DType dtype, std::string_view phase, std::string_view name) {
  require_defined(t, phase, name);
  require(t.dtype == dtype, phase, "{} must have dtype {}; got {}", name, dtype_name(dtype), t);
}

void require_shape(const TensorRef& t, int64_t rows, int64_t cols, std::string_view phase,
                   std::string_view name) {
  require_defined(t, phase, name);
  bool ok = cols < 0 ? (t.dims == 1 && t.rows == rows)
                     : (t.dims == 2 && t.rows == rows && t.cols == cols);
  if (!ok)
    fail(std::string(phase), "{} must have shape {}; got {}", name,
         cols < 0 ? fmt::format("[{}]", rows) : fmt::format("[{}, {}]", rows, cols), t);
}

void require_contiguous(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.contiguous(), phase, "{} must be contiguous; got {} with strides ({}, {})", name, t,
          t.row_stride, t.col_stride);
}

void require_host(const TensorRef& t, std::string_view phase, std::string_view name) {
  require(t.device == Device::host, phase,
          "{} is device memory; this call takes host tensors (the CPU backend) here", name);
}

void require_place(const TensorRef& t, bool on_device, std::string_view phase,
                   std::string_view name) {
  if (on_device)
    require(t.device == Device::cuda, phase, "{} must be device memory; got {}", name, t);
  else
    require_host(t, phase, name);
}

}  // namespace proxyep::gpu_side::ep
