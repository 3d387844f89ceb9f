// `proxyep bench ring --gpu`: the descriptor ring with a GPU producer (issue 17 item 6). CUDA
// threads push 64-byte descriptors with device_push() (gpu_side/cuda/ring_producer.cuh) into a
// ring in mapped pinned host memory; this thread consumes them with RingConsumer, decoding and
// validating each, as a proxy thread would (gpu_side/cuda/ring_bench_kernel.hpp has the kernels).
//
// Per repetition (after one warm-up):
// - throughput: blocks x threads push `ops` descriptors as fast as the consumer frees slots;
//   ops_per_s = ops / (time from the start word, written once every block is running, until the
//   last descriptor was decoded). Kernel launch latency is not counted.
// - latency: one GPU thread answers go words one at a time. For sample i the host notes t0,
//   writes the go word, and notes t1 when it pops descriptor i: latency = t1 - t0, which counts
//   one host-to-GPU notification (the GPU polls the word across PCIe) and the ring's GPU-to-host
//   path. Interleaved with it, the echo: the same round trip with a plain store in place of the
//   push, so latency - echo is what the ring itself adds. Both are host clock only.
// Reports the median ops/s over repetitions and p50/p99 of all samples, against the targets
// (>= 10 M descriptors/s, p50 latency < 3 us).
#pragma once

#include "tools/bench/ring_bench.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the files that add options
}  // namespace CLI

namespace proxyep::tools {

// `--gpu` without a usable CUDA device: ctest's SKIP_RETURN_CODE (tests/gpu/device_check.hpp).
inline constexpr int kNoDeviceExitCode = 77;

// The flags `bench ring` adds for the GPU run (ring_bench.cpp registers them).
struct RingGpuFlags {
  bool enabled = false;
  uint32_t blocks = 0;  // 0: one per multiprocessor
  uint32_t threads = 128;
};

struct RingGpuBenchOptions {
  uint64_t ops = 4'000'000;  // descriptors per throughput repetition
  int reps = 5;              // repetitions (after one warm-up)
  uint64_t capacity = 4096;  // ring slots
  size_t burst = 32;         // descriptors per consumer pop
  uint64_t latency_samples = 20'000;
  int64_t timeout_ms = 60'000;  // every host wait; also each GPU thread's wait
  uint32_t blocks = 0;          // 0: one per multiprocessor
  uint32_t threads = 128;
};

// Throws proxyep::Error, also in a build without CUDA ("this build has no CUDA").
nlohmann::json run_ring_gpu_bench(const RingGpuBenchOptions& options);
void print_ring_gpu_bench(const nlohmann::json& results);

// Throws proxyep::Error naming an option given on `command` (`bench ring`) that the chosen run
// ignores: the CPU run's producer and queue options with --gpu, --gpu-* without it.
void check_ring_gpu_flags(const CLI::App& command, bool gpu);
// `bench ring --gpu`: prints the results (JSON or the table). The exit code: 0, or
// kNoDeviceExitCode when no CUDA device is usable (the reason on stderr).
int bench_ring_gpu_command(const RingBenchOptions& ring, const RingGpuFlags& gpu, bool json);

}  // namespace proxyep::tools
