// The few spellings of device code that the CUDA execution-model emulator (tests/cuda_emulator)
// must see as function calls: a kernel launch, a __shared__ declaration and the one inline PTX
// instruction. Under nvcc each macro expands to exactly the CUDA it names, so the kernels compile
// as before. The emulator compiles the same .cu files as host C++ and defines these macros in its
// own force-included cuda_runtime.h before this header is read, so nothing here names tests/.
#pragma once

#include <cstdint>

#ifndef PROXYEP_CUDA_EMULATOR

// PROXYEP_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...): kernel<<<...>>>(...).
#define PROXYEP_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<grid, block, shared_bytes, stream>>>

// Block-shared variables: one per block, as __shared__ declares them.
#define PROXYEP_SHARED(type, name) __shared__ type name
#define PROXYEP_SHARED_ARRAY(type, name, count) __shared__ type name[count]
// The launch's dynamic shared memory (its third <<<>>> argument), as an array of `type`.
#define PROXYEP_DYNAMIC_SHARED(type, name) extern __shared__ type name[]

#endif  // PROXYEP_CUDA_EMULATOR

namespace proxyep::gpu_side::cuda {

// Nanoseconds on a clock shared by the SMs of one GPU (PTX %globaltimer), which is all a timeout
// needs. The kernels' only inline PTX; the emulator's twin reads the host's steady clock.
__device__ inline uint64_t global_timer_ns() {
#ifdef PROXYEP_CUDA_EMULATOR
  return PROXYEP_EMULATED_GLOBAL_TIMER_NS();
#else
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
#endif
}

}  // namespace proxyep::gpu_side::cuda
