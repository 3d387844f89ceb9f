// ThreadAccessKey: memory only chosen threads may touch, through the CPU's memory protection
// keys (pkeys: Intel PKU, Linux 4.9+). Pages tagged with the key fault (SIGSEGV) when any other
// thread reads or writes them, because each thread's PKRU register starts with the key's access
// disabled (Linux's default for every key but 0) and only allow_this_thread() enables it.
//
// The simulated device (simulated_device.hpp) tags its "device memory" so that only its stream
// thread can touch it: host code that dereferences a device address, which a GPU build would
// turn into garbage or a fault, stops at once in CI instead of silently working.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>

namespace proxyep::gpu_side::device {

class ThreadAccessKey {
 public:
  // A fresh key, or nullopt where the CPU or the kernel has none (or all 15 are taken).
  static std::optional<ThreadAccessKey> allocate();
  ~ThreadAccessKey();
  ThreadAccessKey(ThreadAccessKey&& other) noexcept : key_(other.key_) { other.key_ = -1; }
  ThreadAccessKey& operator=(ThreadAccessKey&& other) noexcept {
    std::swap(key_, other.key_);  // `other` frees what this held
    return *this;
  }
  ThreadAccessKey(const ThreadAccessKey&) = delete;

  // Tags the pages of [memory, memory + bytes) (page-aligned, read-write mapping) with the key.
  // False when the kernel refuses (the memory stays accessible to every thread).
  bool tag(void* memory, size_t bytes) const;
  // Lets the calling thread read and write tagged memory.
  void allow_this_thread() const;
  // Takes that back (for tests that check the fault).
  void deny_this_thread() const;

 private:
  explicit ThreadAccessKey(int key) : key_(key) {}
  int key_ = -1;
};

}  // namespace proxyep::gpu_side::device
