// What emulated device code calls (tests/cuda_emulator): the thread's indices, the block barrier,
// the warp ballot, block-shared memory, fences, sleeps and the launch itself. The shim headers
// (cuda_runtime.h, cuda/atomic) turn CUDA's spellings into these calls; runtime/ implements them
// with fibers under a seeded scheduler (runtime/scheduler.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

namespace cuemu {

// The indices of the CUDA thread running now (one per fiber; the scheduler points at the
// running fiber's before every switch into it).
struct ThreadIndex {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadIndex& current();

void syncthreads(const char* file, int line);
unsigned ballot_sync(unsigned mask, bool predicate, const char* file, int line);
void threadfence_system();
void nanosleep(unsigned ns);
// The PTX %globaltimer's twin: the host's steady clock, in nanoseconds.
uint64_t globaltimer_ns();

// A block's __shared__ variable declared at file:line (one per block, the same address for every
// thread of it), and the launch's dynamic shared memory. Both lie in the block's arena between
// red zones that the access checks watch.
void* block_shared(size_t bytes, size_t align, const char* name, const char* file, int line);
void* dynamic_shared(const char* name, const char* file, int line);

// A cuda::atomic_ref's scope, checked against where its word lives (runtime/detector.cpp).
void check_atomic_scope(const void* word, bool system_scope);

struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
};
// Queues `body` (the kernel with its arguments bound) on `stream`; CUDA's launch checks first, a
// failure left for cudaGetLastError() as CUDA leaves it.
void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body);

// PROXYEP_LAUNCH(kernel, ...)(arguments...): the arguments are evaluated once and copied, as
// CUDA copies them into the launch; every emulated thread calls the kernel with those copies.
template <typename Call>
struct Launcher {
  LaunchSite site;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Call call;

  template <typename... Args>
  void operator()(Args&&... args) const {
    launch(site, grid, block, shared_bytes, stream,
           [call = call, ... bound = std::decay_t<Args>(std::forward<Args>(args))] {
             call(bound...);
           });
  }
};

template <typename T, size_t N>
using array_of = T[N];

}  // namespace cuemu
