// The emulator's model of a launch in progress (tests/cuda_emulator): each CUDA thread a fiber,
// each block its barrier, warps and shared-memory arena. Shared by the scheduler (which runs the
// fibers), the detector (which checks their accesses) and the hooks (which find the running one).
#pragma once

#include <cuda_runtime_api.h>

#include "cuemu/device.hpp"
#include "runtime/context_switch.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cuemu {

struct Block;
struct Grid;

struct Fiber {
  enum class State { runnable, at_barrier, at_ballot, done };

  Context context;
  void* stack = nullptr;
  ThreadIndex index{};
  Block* block = nullptr;
  int tid = 0;  // linear thread index in the block
  State state = State::runnable;
  int runnable_slot = -1;  // its place in the scheduler's runnable list, -1 when parked or done
  bool slept = false;      // its last yield was a __nanosleep
  uint32_t accesses_to_preemption = 1;  // plain accesses until it yields (runtime/detector.cpp)
  // Inside the emulator's own code (a barrier, a ballot, a report): the std library code it calls
  // may be the kernels' instrumented copies (the linker keeps one copy of each inline function),
  // whose accesses are the emulator's, not the kernel's, and go unchecked.
  bool in_runtime = false;
  unsigned ballot_result = 0;
  // Publication rules (runtime/detector.cpp): a plain store to host-mapped memory since the last
  // __threadfence_system, and the 64-byte lines this thread released at system scope since its
  // last acquire or fence.
  bool unfenced_host_store = false;
  std::vector<uintptr_t> released_lines;
};

// One warp's ballot rendezvous.
struct Warp {
  unsigned mask = 0, arrived = 0, predicates = 0;
  const char* file = nullptr;
  int line = 0;
  std::vector<Fiber*> waiting;
};

// One word of block-shared memory as the race check sees it.
struct SharedWord {
  uint32_t epoch = 0;  // the block's barrier generation this record belongs to
  int32_t writer = -1, reader = -1, atomic = -1;  // a thread, kMany, or -1 (none)
  bool written = false;                           // ever, in this block (else a read is uninit)
  bool redzone = false;
};
inline constexpr int32_t kMany = -2;

struct SharedVariable {
  const char* name;
  const char* file;
  int line;
  size_t offset, bytes;
};

inline constexpr size_t kFiberStackBytes = 256 * 1024;

struct Block {
  uint3 index{};
  int32_t linear = 0;  // index.x + index.y * grid.x + index.z * grid.x * grid.y
  int threads = 0, live = 0;
  std::vector<Fiber*> fibers;
  // __syncthreads: arrivals of this generation and where the first arrival waits.
  int arrived = 0;
  uint32_t generation = 1;
  const char* barrier_file = nullptr;
  int barrier_line = 0;
  std::vector<Fiber*> at_barrier;
  std::vector<Warp> warps;
  // The shared-memory arena: [red zone][dynamic][red zone][static variable][red zone]...
  unsigned char* arena = nullptr;
  size_t arena_bytes = 0, arena_used = 0;
  std::vector<SharedWord> shadow;
  std::vector<SharedVariable> variables;
};

struct Grid {
  LaunchSite site;
  dim3 grid, block;
  size_t shared_bytes = 0;
  uint64_t launch_number = 0;
  uint64_t seed = 0;
  std::function<void()> body;
};

// The fiber running on this OS thread, or null outside emulated device code.
Fiber* running_fiber();
const Grid* running_grid();

// Marks the running fiber as inside the emulator for its lifetime (see Fiber::in_runtime).
class RuntimeSection {
 public:
  RuntimeSection();
  ~RuntimeSection();
  RuntimeSection(const RuntimeSection&) = delete;
  RuntimeSection& operator=(const RuntimeSection&) = delete;

 private:
  Fiber* fiber_;
  bool was_;
};

// Ends the launch running on this OS thread at the next scheduling point, as a trap ends a
// kernel on a GPU: its threads never run again (the first fault decides the outcome, and a
// kernel broken mid-protocol would otherwise leave its host side waiting).
void end_running_launch();

// Parks the running fiber and returns to the scheduler (a scheduling point).
void yield_to_scheduler();

}  // namespace cuemu
