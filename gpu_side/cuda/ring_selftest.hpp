// Self-test of the GPU producer: `blocks` thread blocks each push `per_block` descriptors into a
// ring in mapped pinned memory; a host thread consumes them (tests/gpu/test_gpu_ring.cpp). The
// descriptor contents come from selftest_descriptor(), shared by the kernel and the checker.
// Plain C++ (no CUDA types), so g++-compiled code can drive it.
#pragma once

#include "gpu_side/descriptor.hpp"

#include <cstdint>
#include <memory>

namespace proxyep::gpu_side::cuda {

struct SelftestConfig {
  uint32_t blocks = 16;
  uint32_t threads_per_block = 128;
  uint64_t per_block = 8192;             // descriptors each block pushes
  uint64_t timeout_ns = 10'000'000'000;  // a thread's wait for a free slot
};

// Descriptor number `index` of block `block`: exercises every field, ranks >= 1024, offsets past
// 4 GiB, both write_imm and signal, and a unique cookie (block * per_block + index).
PROXYEP_HOST_DEVICE constexpr Descriptor selftest_descriptor(uint32_t block, uint64_t index,
                                                             uint64_t per_block) {
  const uint64_t id = uint64_t{block} * per_block + index;
  Descriptor d;
  d.op = id % 7 == 0 ? Op::signal : Op::write_imm;
  d.flags = (id & 1) != 0 ? kFlagMore : uint16_t{0};
  d.dst_rank = 1024 + block;
  d.local_region = block;
  d.remote_region = ~block;
  d.src_offset = (uint64_t{5} << 30) + id * 64;
  d.dst_offset = (uint64_t{1} << 40) + id * 128;
  d.length = d.op == Op::signal ? 0 : 4096 + id % 1000;
  d.cookie = id;
  d.imm = static_cast<uint32_t>(id * 2654435761u);
  return d;
}

// Launches the producer kernel on a ring created (Ring::create) in cuda_pinned memory whose
// device address is `device_ring`. Throws proxyep::Error on CUDA errors.
class RingSelftest {
 public:
  RingSelftest(void* device_ring, uint64_t capacity, const SelftestConfig& config);
  ~RingSelftest();
  RingSelftest(const RingSelftest&) = delete;
  RingSelftest& operator=(const RingSelftest&) = delete;

  void launch();
  // Waits for the kernel; returns how many threads gave up (device_push returned false).
  uint64_t finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace proxyep::gpu_side::cuda
