// Small kernels with one planted defect each (and clean twins), for the emulator's self-test
// (test_emu_detector.cpp): each launcher runs its kernel on the legacy stream and waits.
#include "gpu_side/cuda/device_compat.cuh"

#include "tests/cuda_emulator/kernels/detector_cases.hpp"

#include <cuda/atomic>

#include <cstdint>

namespace cuemu_cases {
namespace {

constexpr int kThreads = 64;

// Each thread writes its word, then reads its neighbour's: clean with the barrier, a race
// without it.
__global__ void neighbour_kernel(int* out, bool barrier) {
  PROXYEP_SHARED_ARRAY(int, words, kThreads);
  words[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (barrier) __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = words[(threadIdx.x + 1) % kThreads];
}

// Thread 0 writes one word past the array.
__global__ void past_end_kernel() {
  PROXYEP_SHARED_ARRAY(int, words, kThreads);
  words[threadIdx.x] = 1;
  if (threadIdx.x == 0) words[kThreads] = 1;
}

// Reads a shared word nobody wrote.
__global__ void unwritten_kernel(int* out) {
  PROXYEP_SHARED_ARRAY(int, words, kThreads);
  out[threadIdx.x] = words[threadIdx.x];
}

// The two halves of a warp pass different masks to one ballot.
__global__ void unequal_masks_kernel(unsigned* out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu;
  out[threadIdx.x] = __ballot_sync(mask, threadIdx.x % 2 == 0);
}

// A full-mask ballot in every lane: each reads the even lanes.
__global__ void ballot_kernel(unsigned* out) {
  out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 2 == 0);
}

// Half the block waits at one barrier, half at another.
__global__ void split_barrier_kernel() {
  if (threadIdx.x < kThreads / 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

// Thread 0 waits at a barrier that thread 1 never reaches: it waits in a ballot with thread 0.
__global__ void deadlock_kernel() {
  if (threadIdx.x == 0) __syncthreads();
  if (threadIdx.x == 1) (void)__ballot_sync(0x3u, true);
}

// Publishes word 0 of a host-mapped line after a payload store to word 1.
__global__ void publish_kernel(uint64_t* line, PublishMode mode) {
  if (mode == PublishMode::late_payload) {
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(line[0]).store(
        1, ::cuda::memory_order_release);
    line[1] = 42;
    return;
  }
  if (mode == PublishMode::device_scope) {
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device>(line[0]).fetch_add(
        1, ::cuda::memory_order_relaxed);
    return;
  }
  line[1] = 42;
  if (mode == PublishMode::fenced) __threadfence_system();
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(line[0]).store(
      1, ::cuda::memory_order_release);
}

// Spins on a word nobody raises (the watchdog's case).
__global__ void spin_kernel(const uint64_t* word) {
  while (::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*const_cast<uint64_t*>(word))
             .load(::cuda::memory_order_acquire) == 0)
    __nanosleep(1000);
}

cudaError_t finish() {
  const cudaError_t status = cudaGetLastError();
  return status != cudaSuccess ? status : cudaDeviceSynchronize();
}

}  // namespace

cudaError_t run_neighbours(int* out, bool barrier) {
  PROXYEP_LAUNCH(neighbour_kernel, 2, kThreads, 0, nullptr)(out, barrier);
  return finish();
}
cudaError_t run_past_end() {
  PROXYEP_LAUNCH(past_end_kernel, 1, kThreads, 0, nullptr)();
  return finish();
}
cudaError_t run_unwritten(int* out) {
  PROXYEP_LAUNCH(unwritten_kernel, 1, kThreads, 0, nullptr)(out);
  return finish();
}
cudaError_t run_unequal_masks(unsigned* out) {
  PROXYEP_LAUNCH(unequal_masks_kernel, 1, 32, 0, nullptr)(out);
  return finish();
}
cudaError_t run_ballot(unsigned* out, int threads) {
  PROXYEP_LAUNCH(ballot_kernel, 1, threads, 0, nullptr)(out);
  return finish();
}
cudaError_t run_split_barrier() {
  PROXYEP_LAUNCH(split_barrier_kernel, 1, kThreads, 0, nullptr)();
  return finish();
}
cudaError_t run_deadlock() {
  PROXYEP_LAUNCH(deadlock_kernel, 1, 32, 0, nullptr)();
  return finish();
}
cudaError_t run_publish(uint64_t* line, PublishMode mode) {
  PROXYEP_LAUNCH(publish_kernel, 1, 1, 0, nullptr)(line, mode);
  return finish();
}
cudaError_t run_spin(const uint64_t* word) {
  PROXYEP_LAUNCH(spin_kernel, 1, 1, 0, nullptr)(word);
  return finish();
}

}  // namespace cuemu_cases
