// `proxyep bench ring`: the descriptor ring against moodycamel::ConcurrentQueue, in one process,
// carrying the same 64-byte descriptors (encoded with the check word by the producer, decoded
// and validated by the consumer) between P producer threads and one consumer thread. The ring
// runs in its multi-producer mode ("ring" in the report) and, when P is 1, also in its
// single-producer mode ("ring_spsc"); the queues take turns repetition by repetition.
//
// Per queue, producer count and repetition:
// - throughput: P producers push `ops` descriptors in total as fast as the queue takes them;
//   ops_per_s = ops / (time from the start signal until the consumer decoded the last one).
//   Every 64th descriptor carries its enqueue timestamp in the cookie, which gives the latency
//   under load (`loaded_latency_ns`: mostly the time spent queued behind a full queue).
// - latency: each producer pushes one stamped descriptor and waits until the consumer observed
//   it, `latency_samples` times in all: the enqueue-to-observed latency of a single handoff
//   (`latency_ns`).
// Timestamps are TSC ticks on x86 (calibrated against steady_clock), steady_clock elsewhere.
// Reports the median ops/s over repetitions and p50/p99 of all latency samples.
#pragma once

#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace proxyep::tools {

struct RingBenchOptions {
  std::vector<int> producers{1, 2};  // producer thread counts to run
  uint64_t ops = 4'000'000;          // descriptors per throughput repetition
  int reps = 5;                      // repetitions of each (after one warm-up)
  uint64_t capacity = 4096;          // ring slots; moodycamel gets the same minimum capacity
  size_t burst = 32;                 // descriptors per consumer pop
  size_t push_burst = 1;             // descriptors per producer push (1: try_push)
  uint32_t poll_pause = 0;           // spin-loop pauses of the consumer after an empty poll
  bool spsc_fence = false;           // ring_spsc: locked exchange per publish, no membarrier
  std::vector<std::string> queues{"ring", "ring_spsc", "moodycamel"};  // which queues to run
  uint64_t latency_samples = 20'000;  // paced handoffs per repetition
  int64_t timeout_ms = 60'000;        // deadline of every wait
};

nlohmann::json run_ring_bench(const RingBenchOptions& options);
void print_ring_bench(const nlohmann::json& results);
void register_bench_ring(CLI::App& bench, Action& action);

}  // namespace proxyep::tools
