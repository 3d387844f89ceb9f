// CUDA's device-side spellings as host C++ for the emulator (tests/cuda_emulator): force-included
// into every emulated translation unit, as nvcc includes the real header implicitly. It also
// defines the macros of gpu_side/cuda/device_compat.cuh (kernel launches, __shared__ variables),
// so that header defines nothing under PROXYEP_CUDA_EMULATOR.
#pragma once

#include <cuda_runtime_api.h>

#include "cuemu/device.hpp"

#include <string.h>

#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// __shared__ is left undefined on purpose: every shared variable goes through PROXYEP_SHARED*,
// which the emulator places in the block's checked arena.

#define threadIdx (::cuemu::current().thread_idx)
#define blockIdx (::cuemu::current().block_idx)
#define blockDim (::cuemu::current().block_dim)
#define gridDim (::cuemu::current().grid_dim)

#define __syncthreads() ::cuemu::syncthreads(__FILE__, __LINE__)
#define __ballot_sync(mask, predicate) ::cuemu::ballot_sync(mask, predicate, __FILE__, __LINE__)
#define __threadfence_system() ::cuemu::threadfence_system()
#define __nanosleep(ns) ::cuemu::nanosleep(ns)

inline int __popc(unsigned int x) {
  return __builtin_popcount(x);
}

// Device atomics are relaxed RMWs (CUDA's atomicAdd orders nothing); their hooks make each one a
// scheduling point and mark the word atomic for the race check.
inline int atomicAdd(int* address, int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

// The read-only data cache path: a plain read here.
template <typename T>
inline T __ldg(const T* address) {
  return *address;
}

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}

// gpu_side/cuda/device_compat.cuh's macros, emulated.
#define PROXYEP_LAUNCH(kernel, grid, block, shared_bytes, stream)              \
  ::cuemu::Launcher {                                                          \
    ::cuemu::LaunchSite{#kernel, __FILE__, __LINE__}, dim3(grid), dim3(block), \
        static_cast<size_t>(shared_bytes), (stream),                           \
        [](auto... arguments) { kernel(arguments...); }                        \
  }
#define PROXYEP_SHARED(type, name)  \
  type& name = *static_cast<type*>( \
      ::cuemu::block_shared(sizeof(type), alignof(type), #name, __FILE__, __LINE__))
#define PROXYEP_SHARED_ARRAY(type, name, count)                                         \
  ::cuemu::array_of<type, count>& name = *static_cast<::cuemu::array_of<type, count>*>( \
      ::cuemu::block_shared(sizeof(type) * (count), alignof(type), #name, __FILE__, __LINE__))
#define PROXYEP_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::cuemu::dynamic_shared(#name, __FILE__, __LINE__))
#define PROXYEP_EMULATED_GLOBAL_TIMER_NS() ::cuemu::globaltimer_ns()
