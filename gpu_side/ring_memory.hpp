// Memory a ring lives in, mapped by every party that produces into or consumes from it:
//   heap         page-aligned memory of this process: CPU producers and the consumer in one
//                process (the embedded proxy).
//   memfd        a shared mapping of an anonymous file; its fd goes to another process (later
//                the proxy daemon, over a Unix socket), which maps it with map_fd().
//   cuda_pinned  (PROXYEP_HAVE_CUDA) cudaHostAlloc(Mapped | Portable) page-locked host memory
//                and its device pointer, for a GPU producer and a host consumer.
// The ring itself stores no pointers (ring_layout.hpp), so each mapping may sit at a different
// address. Move-only; the destructor unmaps/frees.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace proxyep::gpu_side {

class RingMemory {
 public:
  enum class Kind { heap, memfd, cuda_pinned };

  // Zeroed, page-aligned memory of `bytes` (rounded up to a page).
  static RingMemory heap(size_t bytes);
  // A new memfd named `name` (visible in /proc/<pid>/fd) of `bytes`, mapped shared.
  static RingMemory memfd(size_t bytes, const std::string& name);
  // Maps the memfd `fd` another party created (its whole size). `fd` is duplicated; the caller
  // keeps its own.
  static RingMemory map_fd(int fd);
#if PROXYEP_HAVE_CUDA
  // Mapped, portable pinned host memory; device() is its address for kernels.
  static RingMemory cuda_pinned(size_t bytes);
#endif

  ~RingMemory();
  RingMemory(RingMemory&& other) noexcept;
  RingMemory& operator=(RingMemory&& other) noexcept;
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;

  Kind kind() const {
    return kind_;
  }
  std::span<std::byte> bytes() const {
    return {static_cast<std::byte*>(host_), size_};
  }
  void* host() const {
    return host_;
  }
  // Device address of the same bytes (cuda_pinned), else nullptr.
  void* device() const {
    return device_;
  }
  // The memfd (memfd / map_fd), else -1. Owned by this object.
  int fd() const {
    return fd_;
  }
  size_t size() const {
    return size_;
  }

 private:
  RingMemory(Kind kind, void* host, size_t size) : kind_(kind), host_(host), size_(size) {}
  void release() noexcept;

  Kind kind_ = Kind::heap;
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace proxyep::gpu_side
