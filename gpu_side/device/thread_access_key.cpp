// Memory protection keys for the simulated device (thread_access_key.hpp).
#include "gpu_side/device/thread_access_key.hpp"

#include <sys/mman.h>

namespace proxyep::gpu_side::device {

std::optional<ThreadAccessKey> ThreadAccessKey::allocate() {
  // The initial rights apply to the calling thread only; every other thread already has the
  // key's access disabled, which is the point.
  const int key = ::pkey_alloc(0, PKEY_DISABLE_ACCESS);
  if (key < 0) return std::nullopt;
  return ThreadAccessKey(key);
}

ThreadAccessKey::~ThreadAccessKey() {
  // Pages still tagged with a freed key are not reachable through it any more; the simulated
  // device unmaps all of its memory before its key goes.
  if (key_ >= 0) ::pkey_free(key_);
}

bool ThreadAccessKey::tag(void* memory, size_t bytes) const {
  return ::pkey_mprotect(memory, bytes, PROT_READ | PROT_WRITE, key_) == 0;
}

void ThreadAccessKey::allow_this_thread() const {
  (void)::pkey_set(key_, 0);
}

void ThreadAccessKey::deny_this_thread() const {
  (void)::pkey_set(key_, PKEY_DISABLE_ACCESS);
}

}  // namespace proxyep::gpu_side::device
