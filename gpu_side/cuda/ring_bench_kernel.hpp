// Kernels of `proxyep bench ring --gpu` (tools/bench/ring_gpu_bench.hpp): GPU threads push
// descriptors with device_push() (ring_producer.cuh) into a ring in mapped pinned memory that a
// host thread consumes. Plain C++ (no CUDA types), so g++-compiled code can drive it.
//
// Host and kernel meet in a RingBenchControl, also in mapped pinned memory:
// - throughput: every block checks in (arrived) and spins on `start`, so the host starts its
//   clock after the launch, not before it: launch latency is not counted.
// - latency: one thread answers the host's `go` words one at a time. Odd words ask for an echo
//   (a plain store into `echo`, no ring), even ones for a descriptor: the two round trips differ
//   only by the ring, and both start and end on the host clock (no GPU timer is compared with it).
// Every wait on the GPU side ends after timeout_ns (the thread gives up and is counted), and
// `stop` makes threads return early, so a kernel always ends and the host never waits forever.
#pragma once

#include "gpu_side/descriptor.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace proxyep::gpu_side::cuda {

struct RingBenchKernelConfig {
  uint32_t blocks = 132;  // throughput kernel; must all be resident at once (they wait on start)
  uint32_t threads_per_block = 128;
  uint64_t timeout_ns = 10'000'000'000;  // any one wait of a GPU thread
};

// One word per line: the host polls some while the GPU writes others.
struct alignas(128) ControlWord {
  uint64_t value;
};

// Zeroed by the host before each launch.
struct RingBenchControl {
  ControlWord start;    // host: 1 releases the throughput blocks
  ControlWord stop;     // host: 1 makes every thread return at its next check (on an error)
  ControlWord arrived;  // GPU: blocks (latency: threads) that reached their start line
  ControlWord go;       // host: 2i + 1 asks for echo i, 2i + 2 for descriptor i; kGoStop stops
  ControlWord echo;     // GPU: 2i + 1 once go = 2i + 1 was seen
};

inline constexpr uint64_t kGoStop = ~uint64_t{0};

// Descriptor `index` of a run: the host checks decode() and the sum of src_offset.
PROXYEP_HOST_DEVICE constexpr Descriptor ring_bench_descriptor(uint64_t index) {
  Descriptor d;
  d.op = Op::write_imm;
  d.dst_rank = static_cast<uint32_t>(index % 1024);
  d.local_region = 1;
  d.remote_region = 2;
  d.src_offset = index;
  d.dst_offset = index * 64;
  d.length = 64;
  d.cookie = index;
  d.imm = static_cast<uint32_t>(index);
  return d;
}

// What the host learns of the device before it runs anything; never throws.
struct DeviceInfo {
  int count = 0;       // CUDA devices visible (0 when the query failed)
  std::string status;  // cudaGetDeviceCount's result, e.g. "cudaErrorNoDevice (no CUDA...)"
  std::string name;    // device 0, when count > 0
  int multiprocessors = 0;
};
DeviceInfo query_device();

// Drives the kernels on a ring created (Ring::create, multi-producer) in cuda_pinned memory whose
// device address is `device_ring`, with a zeroed RingBenchControl at `device_control` (mapped
// pinned memory too). One kernel at a time. Throws proxyep::Error on CUDA errors.
class RingBenchKernel {
 public:
  RingBenchKernel(void* device_ring, uint64_t capacity, void* device_control,
                  const RingBenchKernelConfig& config);
  // Waits for a kernel still running: bounded, since every GPU wait has its timeout.
  ~RingBenchKernel();
  RingBenchKernel(const RingBenchKernel&) = delete;
  RingBenchKernel& operator=(const RingBenchKernel&) = delete;

  // Throughput blocks x threads can be resident together (they spin on start until all are).
  uint32_t max_resident_blocks() const;
  // All blocks x threads push descriptors [0, ops) once control.start is 1.
  void launch_throughput(uint64_t ops);
  // One thread answers `samples` echo/descriptor pairs of go words.
  void launch_latency(uint64_t samples);
  // True once the kernel has ended; throws when it failed (a fault, a launch error).
  bool done();
  // Waits for the kernel; returns how many threads gave up (a wait past timeout_ns).
  uint64_t finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace proxyep::gpu_side::cuda
