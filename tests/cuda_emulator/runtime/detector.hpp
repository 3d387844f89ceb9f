// The emulator's checks (tests/cuda_emulator/runtime/detector.cpp): every load and store of the
// emulated kernels reaches on_access() through the compiler's -fsanitize=thread hooks
// (tsan_hooks.cpp), and the checks below name what a GPU would have done wrong:
//   race        two threads of a block touch a shared word between barriers, one writing (plain
//               against plain or plain against atomic; atomic against atomic is fine);
//   uninit      a thread reads a shared word no thread of its block has written;
//   oob         an access in the red zones around each shared variable;
//   unfenced    a release store or RMW to host-mapped memory by a thread that made plain stores
//               to host-mapped memory since its last __threadfence_system (a project rule,
//               stricter than PTX, whose st.release.sys would order them: the ring protocol and
//               the signal words fence first, and the rule holds them to it);
//   late-payload a plain store into a 64-byte line the thread released to host-mapped memory,
//               with no acquire or fence of its own in between (payload written after seq);
//   scope       a device-scope atomic on host-mapped memory (the CPU is outside its scope);
//   barrier / ballot / deadlock: reported by the scheduler.
// A fault prints one line (`cuemu: <kind>: ...`, with the kernel, block, thread and seed) and
// makes the next synchronisation return cudaErrorLaunchFailure, as a GPU's sticky error does.
#pragma once

#include "runtime/fiber.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace cuemu {

enum class Order { plain, relaxed, acquire, release, acq_rel, seq_cst };

void on_access(const void* address, size_t bytes, bool write);
void on_atomic(const void* address, size_t bytes, Order order, bool writes);
void on_fence();

void report_fault(const char* kind, const std::string& detail);
// A source path as the repository names it (gpu_side/cuda/x.cu), else its file name.
std::string short_path(const char* file);
// cudaSuccess, or cudaErrorLaunchFailure once any fault was reported.
cudaError_t sticky_error();

// Host memory the emulated device sees as mapped (cudaHostRegister, cudaHostAlloc).
void add_host_mapped(const void* begin, size_t bytes);
void remove_host_mapped(const void* begin);
bool is_host_mapped(const void* address);

}  // namespace cuemu
