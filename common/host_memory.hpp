// HostMemory: page-aligned host memory, owned by one move-only value that frees it.
//   heap     zeroed memory of this process (anonymous pages, zero on first touch): producers
//            and consumers in one process.
//   memfd    a shared mapping of an anonymous file; its fd goes to another process (a node peer
//            through /proc/<pid>/fd, later the proxy daemon over a Unix socket), which maps it
//            with map_fd().
//   adopted  memory another allocator made, freed by the deleter it came with; the CUDA mapped
//            pinned memory of gpu_side/pinned_memory.hpp is one (with its device address).
// Nothing stored in it may be a pointer: each mapping may sit at a different address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace proxyep {

class HostMemory {
 public:
  enum class Kind { heap, memfd, adopted };
  // Frees adopted memory; called once, with the host address adopt() was given. Must not throw.
  using Deleter = std::function<void(void* host)>;

  // Zeroed, page-aligned memory of `bytes` (rounded up to a page).
  static HostMemory heap(size_t bytes);
  // A new memfd named `name` (visible in /proc/<pid>/fd) of `bytes`, mapped shared.
  static HostMemory memfd(size_t bytes, const std::string& name);
  // Maps the memfd `fd` another party created (its whole size). `fd` is duplicated; the caller
  // keeps its own.
  static HostMemory map_fd(int fd);
  // Maps the memfd that process `pid` holds as its descriptor `fd` (through /proc/<pid>/fd: a
  // process of the same user on this machine; a node peer). Throws proxyep::Error("host_memory")
  // naming the path when it cannot be opened or mapped.
  static HostMemory map_process_fd(uint64_t pid, uint64_t fd);
  // Takes ownership of `size` bytes at `host` that another allocator made; `release(host)` frees
  // them when this object goes. `device` is the address of the same bytes on a device, if any.
  static HostMemory adopt(void* host, size_t size, void* device, Deleter release);

  ~HostMemory();
  HostMemory(HostMemory&& other) noexcept;
  HostMemory& operator=(HostMemory&& other) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  Kind kind() const { return kind_; }
  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(host_), size_}; }
  void* host() const { return host_; }
  // Device address of the same bytes (adopted memory that has one), else nullptr.
  void* device() const { return device_; }
  // The memfd (memfd / map_fd), else -1. Owned by this object.
  int fd() const { return fd_; }
  size_t size() const { return size_; }

 private:
  HostMemory(Kind kind, void* host, size_t size) : kind_(kind), host_(host), size_(size) {}
  void release() noexcept;

  Kind kind_ = Kind::heap;
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  Deleter deleter_;  // adopted only
};

}  // namespace proxyep
