#include "tools/bench/ring_gpu_bench.hpp"

#include "common/error.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <string>

#if PROXYEP_HAVE_CUDA
#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "gpu_side/cuda/ring_bench_kernel.hpp"
#include "gpu_side/pinned_memory.hpp"
#include "gpu_side/ring.hpp"
#include "tools/bench/stats.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#endif

namespace proxyep::tools {
namespace {

constexpr const char* kPhase = "bench.ring";

#if PROXYEP_HAVE_CUDA

constexpr double kTargetOpsPerS = 10e6;  // issue 17 item 6
constexpr double kTargetLatencyNs = 3000;

using gpu_side::Descriptor;
using gpu_side::WireDescriptor;
using gpu_side::cuda::ControlWord;
using gpu_side::cuda::RingBenchControl;
using SteadyClock = std::chrono::steady_clock;
// Empty polls between looks at the deadline, the ring's health and the kernel's state (a CUDA
// call each): rare enough not to slow the consumer, often enough to notice in microseconds.
constexpr uint64_t kCheckEvery = 4096;

std::atomic_ref<uint64_t> word(ControlWord& control) {
  return std::atomic_ref<uint64_t>(control.value);
}

double ns_since(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::nano>(SteadyClock::now() - start).count();
}

// The ring and the control words in mapped pinned memory, the consumer and the kernel driver,
// for all repetitions: positions and the kernel's device counters carry over between launches.
class GpuRun {
 public:
  GpuRun(const RingGpuBenchOptions& options, uint32_t blocks)
      : options_(options),
        ring_memory_(gpu_side::cuda_pinned_memory(gpu_side::Ring::bytes_for(options.capacity))),
        ring_(gpu_side::Ring::create(ring_memory_.bytes(), options.capacity)),
        consumer_(ring_),
        control_memory_(gpu_side::cuda_pinned_memory(sizeof(RingBenchControl))),
        control_(*static_cast<RingBenchControl*>(control_memory_.host())),
        kernel_(ring_memory_.device(), options.capacity, control_memory_.device(),
                {.blocks = blocks,
                 .threads_per_block = options.threads,
                 .timeout_ns = static_cast<uint64_t>(options.timeout_ms) * 1'000'000}),
        blocks_(blocks) {
    const uint32_t resident = kernel_.max_resident_blocks();
    require(blocks <= resident, kPhase,
            "--gpu-blocks {} x --gpu-threads {}: at most {} such blocks fit on the device at once, "
            "and every block must be running before the clock starts",
            blocks, options.threads, resident);
  }
  // After an error, a kernel may still be running: stop it and drain what it still pushes, so
  // its threads end now rather than after their timeout; the driver then waits for it.
  ~GpuRun() { abort(); }
  GpuRun(const GpuRun&) = delete;
  GpuRun& operator=(const GpuRun&) = delete;

  double throughput_rep();
  void latency_rep(std::vector<double>& ring_ns, std::vector<double>& echo_ns);

 private:
  Deadline deadline() const { return Deadline(std::chrono::milliseconds(options_.timeout_ms)); }
  void reset_control();
  void wait_arrived(uint64_t expected, const char* what);
  void check_alive(const Deadline& deadline, const char* what, uint64_t delivered,
                   uint64_t expected);
  void finish(const char* what);
  void abort() noexcept;

  const RingGpuBenchOptions& options_;
  HostMemory ring_memory_;
  gpu_side::Ring ring_;
  gpu_side::RingConsumer consumer_;
  HostMemory control_memory_;
  RingBenchControl& control_;
  gpu_side::cuda::RingBenchKernel kernel_;
  uint32_t blocks_;
};

void GpuRun::reset_control() {
  // Before the launch, which orders these stores before the kernel's first read.
  for (ControlWord* w :
       {&control_.start, &control_.stop, &control_.arrived, &control_.go, &control_.echo})
    word(*w).store(0, std::memory_order_relaxed);
}

void GpuRun::wait_arrived(uint64_t expected, const char* what) {
  const Deadline deadline = this->deadline();
  Backoff backoff;
  // relaxed: only the count matters; the blocks read nothing the host writes before start.
  for (uint64_t polls = 1; word(control_.arrived).load(std::memory_order_relaxed) < expected;
       ++polls) {
    if (polls % kCheckEvery == 0) {
      if (kernel_.done()) {
        const uint64_t gave_up = kernel_.finish();
        fail(kPhase, "{}: the kernel ended before it started ({} threads gave up)", what, gave_up);
      }
      require(!deadline.expired(), kPhase,
              "{}: {} of {} blocks were running after {} ms (the GPU is busy with other work?)",
              what, word(control_.arrived).load(std::memory_order_relaxed), expected,
              options_.timeout_ms);
    }
    backoff.pause();
  }
}

// Throws when the run cannot complete: the deadline passed, a GPU thread gave up on a slot (its
// position is abandoned: the ring is dead), or the kernel ended (or faulted) short of `expected`.
void GpuRun::check_alive(const Deadline& deadline, const char* what, uint64_t delivered,
                         uint64_t expected) {
  require(consumer_.health() == Status::ok, kPhase,
          "{}: a GPU thread gave up waiting for a free slot after {} ms ({} of {} descriptors "
          "delivered)",
          what, options_.timeout_ms, delivered, expected);
  // Once the kernel is done its stores are visible: nothing more is coming.
  if (kernel_.done() && !consumer_.ready()) {
    const uint64_t gave_up = kernel_.finish();
    fail(kPhase, "{}: the kernel ended with {} of {} descriptors delivered ({} threads gave up)",
         what, delivered, expected, gave_up);
  }
  require(!deadline.expired(), kPhase, "{}: {} of {} descriptors delivered within {} ms", what,
          delivered, expected, options_.timeout_ms);
}

void GpuRun::finish(const char* what) {
  const uint64_t gave_up = kernel_.finish();
  require(gave_up == 0, kPhase, "{}: {} GPU threads gave up waiting", what, gave_up);
  require(consumer_.health() == Status::ok && !consumer_.ready(), kPhase,
          "{}: the ring holds more than the run pushed, or a position was abandoned", what);
}

void GpuRun::abort() noexcept {
  try {
    // release: pairs with the kernel's system-scope acquire loads of stop and go.
    word(control_.stop).store(1, std::memory_order_release);
    word(control_.go).store(gpu_side::cuda::kGoStop, std::memory_order_release);
    std::array<WireDescriptor, 64> sink;
    const Deadline deadline = this->deadline();
    while (!kernel_.done() && !deadline.expired())
      (void)consumer_.pop_burst(sink);
  } catch (const Error&) {
    // A faulted kernel: nothing to drain; the driver's destructor returns at once.
  }
}

double GpuRun::throughput_rep() {
  constexpr const char* kWhat = "throughput";
  const uint64_t ops = options_.ops;
  reset_control();
  kernel_.launch_throughput(ops);
  wait_arrived(blocks_, kWhat);
  std::vector<WireDescriptor> buffer(options_.burst);
  uint64_t received = 0, checksum = 0, corrupt = 0;
  const Deadline deadline = this->deadline();
  const auto start = SteadyClock::now();
  // release: pairs with the blocks' system-scope acquire load of start.
  word(control_.start).store(1, std::memory_order_release);
  for (uint64_t empty_polls = 0; received < ops;) {
    const size_t n = consumer_.pop_burst(buffer);
    if (n == 0) {
      if (++empty_polls % kCheckEvery == 0) check_alive(deadline, kWhat, received, ops);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      Descriptor d;
      if (gpu_side::decode(buffer[i], d) != gpu_side::DecodeResult::ok) {
        ++corrupt;
        continue;
      }
      checksum += d.src_offset;
    }
    received += n;
  }
  const double seconds = ns_since(start) / 1e9;
  finish(kWhat);
  const uint64_t expected = ops * (ops - 1) / 2;
  require(corrupt == 0 && checksum == expected, kPhase,
          "{}: {} corrupt descriptors of {}, checksum {} expected {}", kWhat, corrupt, ops,
          checksum, expected);
  return static_cast<double>(ops) / seconds;
}

void GpuRun::latency_rep(std::vector<double>& ring_ns, std::vector<double>& echo_ns) {
  constexpr const char* kWhat = "latency";
  const uint64_t samples = options_.latency_samples;
  reset_control();
  kernel_.launch_latency(samples);
  wait_arrived(1, kWhat);
  const Deadline deadline = this->deadline();
  std::array<WireDescriptor, 1> slot;
  for (uint64_t i = 0; i < samples; ++i) {
    auto start = SteadyClock::now();
    // release: pairs with the kernel's system-scope acquire load of go (both stores below).
    word(control_.go).store(2 * i + 1, std::memory_order_release);
    // acquire: pairs with the kernel's system-scope release store of echo.
    for (uint64_t polls = 1; word(control_.echo).load(std::memory_order_acquire) != 2 * i + 1;
         ++polls)
      if (polls % kCheckEvery == 0) check_alive(deadline, kWhat, i, samples);
    echo_ns.push_back(ns_since(start));
    start = SteadyClock::now();
    word(control_.go).store(2 * i + 2, std::memory_order_release);
    for (uint64_t polls = 1; consumer_.pop_burst(slot) == 0; ++polls)
      if (polls % kCheckEvery == 0) check_alive(deadline, kWhat, i, samples);
    ring_ns.push_back(ns_since(start));
    Descriptor d;
    require(gpu_side::decode(slot[0], d) == gpu_side::DecodeResult::ok && d.cookie == i, kPhase,
            "{}: sample {} popped a corrupt or foreign descriptor", kWhat, i);
  }
  finish(kWhat);
}

nlohmann::json report(const std::vector<double>& ops_per_s, const std::vector<double>& ring_ns,
                      const std::vector<double>& echo_ns) {
  const Summary rate = summarize(ops_per_s);
  const Summary ring = summarize(ring_ns);
  const Summary echo = summarize(echo_ns);
  return {{"ops_per_s", rate.p50},
          {"ops_per_s_min", rate.min},
          {"ops_per_s_max", rate.max},
          {"latency_ns_p50", ring.p50},
          {"latency_ns_p99", ring.p99},
          {"latency_samples", ring.count},
          {"echo_ns_p50", echo.p50},
          {"echo_ns_p99", echo.p99},
          {"ring_minus_echo_ns_p50", ring.p50 - echo.p50}};
}

#endif  // PROXYEP_HAVE_CUDA

}  // namespace

nlohmann::json run_ring_gpu_bench(const RingGpuBenchOptions& options) {
#if PROXYEP_HAVE_CUDA
  require(options.ops > 0 && options.reps > 0 && options.burst > 0 && options.latency_samples > 0 &&
              options.timeout_ms > 0 && options.threads > 0,
          kPhase, "ops, reps, burst, latency samples, timeout and GPU threads must be positive");
  require(gpu_side::is_power_of_two(options.capacity) && options.capacity >= 2, kPhase,
          "--capacity {} must be a power of two >= 2", options.capacity);
  const gpu_side::cuda::DeviceInfo device = gpu_side::cuda::query_device();
  require(device.count > 0, kPhase, "--gpu: no CUDA device (cudaGetDeviceCount: {}, {} devices)",
          device.status, device.count);
  const uint32_t blocks =
      options.blocks != 0 ? options.blocks : static_cast<uint32_t>(device.multiprocessors);
  std::vector<double> ops_per_s, ring_ns, echo_ns;
  {
    GpuRun run(options, blocks);
    std::vector<double> ring_rep, echo_rep;
    for (int rep = 0; rep <= options.reps; ++rep) {
      const double rate = run.throughput_rep();
      ring_rep.clear();
      echo_rep.clear();
      run.latency_rep(ring_rep, echo_rep);
      if (rep == 0) continue;  // warm-up
      ops_per_s.push_back(rate);
      ring_ns.insert(ring_ns.end(), ring_rep.begin(), ring_rep.end());
      echo_ns.insert(echo_ns.end(), echo_rep.begin(), echo_rep.end());
    }
  }
  nlohmann::json row = {{"gpu_blocks", blocks},
                        {"gpu_threads", options.threads},
                        {"ring_gpu", report(ops_per_s, ring_ns, echo_ns)}};
  const auto& r = row["ring_gpu"];
  return {{"benchmark", "ring_gpu"},
          {"device", device.name},
          {"multiprocessors", device.multiprocessors},
          {"capacity", options.capacity},
          {"burst", options.burst},
          {"ops", options.ops},
          {"reps", options.reps},
          {"latency_samples", options.latency_samples},
          {"timeout_ms", options.timeout_ms},
          {"cpus", std::thread::hardware_concurrency()},
          {"targets",
           {{"ops_per_s", kTargetOpsPerS},
            {"latency_ns_p50", kTargetLatencyNs},
            {"ops_per_s_met", r["ops_per_s"].get<double>() >= kTargetOpsPerS},
            {"latency_met", r["latency_ns_p50"].get<double>() < kTargetLatencyNs}}},
          {"results", nlohmann::json::array({row})}};
#else
  (void)options;
  fail(kPhase, "--gpu: this build has no CUDA (no CUDA compiler was found when it was configured)");
#endif
}

void print_ring_gpu_bench(const nlohmann::json& r) {
  fmt::print(
      "GPU ring benchmark: {} ({} SMs), capacity {}, burst {}, {} descriptors x {} reps, {} "
      "latency samples per rep\n",
      r["device"].get<std::string>(), r["multiprocessors"].get<int>(),
      r["capacity"].get<uint64_t>(), r["burst"].get<size_t>(), r["ops"].get<uint64_t>(),
      r["reps"].get<int>(), r["latency_samples"].get<uint64_t>());
  fmt::print("{:>7} {:>7} {:>10} {:>8} {:>8} {:>10} {:>10} {:>11} {:>11}\n", "blocks", "threads",
             "Mops/s p50", "min", "max", "lat p50ns", "lat p99ns", "echo p50ns", "echo p99ns");
  for (const auto& row : r["results"]) {
    const auto& q = row["ring_gpu"];
    fmt::print("{:>7} {:>7} {:>10.1f} {:>8.1f} {:>8.1f} {:>10.0f} {:>10.0f} {:>11.0f} {:>11.0f}\n",
               row["gpu_blocks"].get<uint32_t>(), row["gpu_threads"].get<uint32_t>(),
               q["ops_per_s"].get<double>() / 1e6, q["ops_per_s_min"].get<double>() / 1e6,
               q["ops_per_s_max"].get<double>() / 1e6, q["latency_ns_p50"].get<double>(),
               q["latency_ns_p99"].get<double>(), q["echo_ns_p50"].get<double>(),
               q["echo_ns_p99"].get<double>());
  }
  const auto& t = r["targets"];
  fmt::print("targets: >= {:.0f} M descriptors/s {}; p50 latency < {:.0f} ns {}\n",
             t["ops_per_s"].get<double>() / 1e6, t["ops_per_s_met"].get<bool>() ? "met" : "NOT met",
             t["latency_ns_p50"].get<double>(), t["latency_met"].get<bool>() ? "met" : "NOT met");
  fmt::print(
      "lat: host writes a go word, the GPU (polling it across PCIe) pushes a descriptor, the host "
      "pops it: one host-to-GPU notification plus the ring's GPU-to-host path. echo: the same "
      "round trip with a plain store instead of the push.\n");
}

void check_ring_gpu_flags(const CLI::App& command, bool gpu) {
  const char* const cpu_only[] = {"--producers", "--push-burst", "--poll-pause", "--queues",
                                  "--spsc-fence"};
  const char* const gpu_only[] = {"--gpu-blocks", "--gpu-threads"};
  if (gpu) {
    for (const char* name : cpu_only)
      require(command.get_option(name)->count() == 0, kPhase,
              "{} applies to the CPU producers, not to --gpu", name);
  } else {
    for (const char* name : gpu_only)
      require(command.get_option(name)->count() == 0, kPhase, "{} applies to --gpu only", name);
  }
}

int bench_ring_gpu_command(const RingBenchOptions& ring, const RingGpuFlags& gpu, bool json) {
#if PROXYEP_HAVE_CUDA
  // Checked first and apart, so that "no device" has its own exit code (a skip for ctest).
  const gpu_side::cuda::DeviceInfo device = gpu_side::cuda::query_device();
  if (device.count == 0) {
    std::fprintf(stderr,
                 "proxyep: error: %s: --gpu: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                 kPhase, device.status.c_str(), device.count);
    return kNoDeviceExitCode;
  }
#endif
  const RingGpuBenchOptions options{.ops = ring.ops,
                                    .reps = ring.reps,
                                    .capacity = ring.capacity,
                                    .burst = ring.burst,
                                    .latency_samples = ring.latency_samples,
                                    .timeout_ms = ring.timeout_ms,
                                    .blocks = gpu.blocks,
                                    .threads = gpu.threads};
  const nlohmann::json results = run_ring_gpu_bench(options);
  if (json)
    fmt::print("{}\n", results.dump(2));
  else
    print_ring_gpu_bench(results);
  return 0;
}

}  // namespace proxyep::tools
