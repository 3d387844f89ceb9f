#include "tools/bench/ring_bench.hpp"

#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "tools/bench/ring_bench_queues.hpp"
#include "tools/bench/ring_gpu_bench.hpp"
#include "tools/bench/stats.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

namespace proxyep::tools {
namespace {

using gpu_side::Descriptor;
using gpu_side::WireDescriptor;
using SteadyClock = std::chrono::steady_clock;
constexpr uint64_t kStampEvery = 64;  // throughput runs stamp one descriptor in 64

// Timestamps for the cookie: the TSC where there is one (a few ns to read, vs ~20 for the
// vDSO clock), converted to ns with a rate measured against steady_clock over the whole run.
uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
#endif
}

class TickRate {
 public:
  TickRate() : ticks_(ticks()), time_(SteadyClock::now()) {}
  double ns_per_tick() const {
    const double ns = std::chrono::duration<double, std::nano>(SteadyClock::now() - time_).count();
    const auto elapsed = static_cast<double>(ticks() - ticks_);
    return elapsed > 0 ? ns / elapsed : 1.0;
  }

 private:
  uint64_t ticks_;
  SteadyClock::time_point time_;
};

Descriptor bench_descriptor(int producer, uint64_t index, uint64_t cookie) {
  return Descriptor{.op = gpu_side::Op::write_imm,
                    .dst_rank = static_cast<uint32_t>(producer),
                    .local_region = 1,
                    .remote_region = 2,
                    .src_offset = index,
                    .dst_offset = index * 64,
                    .length = 64,
                    .cookie = cookie,
                    .imm = static_cast<uint32_t>(index)};
}

// Samples and figures of one queue at one producer count, over all repetitions.
struct Series {
  std::vector<double> ops_per_s;
  std::vector<uint64_t> loaded_ticks;  // enqueue-to-observed under saturation
  std::vector<uint64_t> paced_ticks;   // enqueue-to-observed of single handoffs
};

struct Run {
  const RingBenchOptions& options;
  int producers;
  Deadline deadline() const { return Deadline(std::chrono::milliseconds(options.timeout_ms)); }
  ring_bench::QueueConfig config() const {
    return {.capacity = options.capacity, .producers = producers, .spsc_fence = options.spsc_fence};
  }
};

// Pushes `d`, retrying while the queue is full; false when `deadline` passed first. (No throw:
// it runs on producer threads, where an exception would terminate the process.)
template <typename Queue>
bool spin_push(typename Queue::Producer& producer, const Descriptor& d, const Deadline& deadline) {
  Backoff backoff;
  for (uint32_t i = 0; !producer.try_push(d); ++i) {
    if (i % 4096 == 4095 && deadline.expired()) return false;
    backoff.pause();
  }
  return true;
}

// Pushes descriptors [0, count) of producer `id` in bursts of up to `burst`.
template <typename Queue>
void produce_bursts(typename Queue::Producer& producer, int id, uint64_t count, size_t burst,
                    const Deadline& deadline) {
  std::vector<Descriptor> batch(burst);
  Backoff backoff;
  for (uint64_t i = 0, attempts = 0; i < count; ++attempts) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(burst, count - i));
    for (size_t k = 0; k < n; ++k)
      batch[k] = bench_descriptor(id, i + k, (i + k) % kStampEvery == 0 ? ticks() : 0);
    const size_t pushed = producer.try_push_burst(std::span(batch).first(n));
    i += pushed;
    if (pushed != 0) {
      backoff.reset();
      continue;
    }
    if (attempts % 4096 == 4095 && deadline.expired()) return;
    backoff.pause();
  }
}

// The consumer after an empty poll: `pauses` spin-loop hints first, which leave the line the
// producer is writing alone for a while (polling it at full speed steals it from the producer
// between its stores), then a yield every 64 empty polls, so that an oversubscribed producer
// gets the CPU.
void idle(uint32_t pauses, uint32_t& empty_polls) {
  for (uint32_t i = 0; i < pauses; ++i)
    cpu_relax();
  if (++empty_polls % 64 == 0) std::this_thread::yield();
}

// Decodes `slots`; stamped cookies become latency samples relative to one clock read.
void consume(std::span<const WireDescriptor> slots, std::vector<uint64_t>& samples,
             uint64_t& checksum, uint64_t& corrupt) {
  uint64_t now = 0;
  for (const WireDescriptor& slot : slots) {
    Descriptor d;
    if (gpu_side::decode(slot, d) != gpu_side::DecodeResult::ok) {
      ++corrupt;
      continue;
    }
    checksum += d.src_offset;
    if (d.cookie == 0) continue;
    if (now == 0) now = ticks();
    samples.push_back(now - d.cookie);
  }
}

template <typename Queue>
double throughput_rep(const Run& run, std::vector<uint64_t>& samples) {
  const Deadline deadline = run.deadline();
  const uint64_t each = run.options.ops / static_cast<uint64_t>(run.producers);
  const uint64_t total = each * static_cast<uint64_t>(run.producers);
  Queue queue(run.config());
  typename Queue::Consumer consumer(queue);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int id = 0; id < run.producers; ++id)
    threads.emplace_back([&, id] {
      typename Queue::Producer producer(queue, id);
      while (!go.load(std::memory_order_acquire))
        cpu_relax();
      if (run.options.push_burst > 1) {
        produce_bursts<Queue>(producer, id, each, run.options.push_burst, deadline);
        return;
      }
      for (uint64_t i = 0; i < each; ++i)
        if (!spin_push<Queue>(producer, bench_descriptor(id, i, i % kStampEvery == 0 ? ticks() : 0),
                              deadline))
          return;
    });
  std::vector<WireDescriptor> buffer(run.options.burst);
  uint64_t received = 0, checksum = 0, corrupt = 0;
  uint32_t empty_polls = 0;
  const auto start = SteadyClock::now();
  go.store(true, std::memory_order_release);
  while (received < total) {
    const size_t n = consumer.pop(buffer);
    if (n == 0) {
      idle(run.options.poll_pause, empty_polls);
      if (empty_polls % 4096 == 0 && deadline.expired()) break;
      continue;
    }
    consume(std::span(buffer).first(n), samples, checksum, corrupt);
    received += n;
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  for (auto& thread : threads)
    thread.join();
  const uint64_t expected = static_cast<uint64_t>(run.producers) * (each * (each - 1) / 2);
  require(received == total && corrupt == 0 && checksum == expected, "bench.ring",
          "{}: received {} of {} descriptors ({} corrupt, checksum {} expected {})", Queue::kName,
          received, total, corrupt, checksum, expected);
  return static_cast<double>(total) / seconds;
}

// One cache line per producer: the consumer's count of that producer's observed descriptors.
struct alignas(gpu_side::kFalseSharingRange) Observed {
  std::atomic<uint64_t> count{0};
};

template <typename Queue>
void latency_rep(const Run& run, std::vector<uint64_t>& samples) {
  const Deadline deadline = run.deadline();
  const uint64_t each = std::max<uint64_t>(1, run.options.latency_samples / run.producers);
  Queue queue(run.config());
  typename Queue::Consumer consumer(queue);
  std::vector<Observed> observed(static_cast<size_t>(run.producers));
  std::vector<std::thread> threads;
  for (int id = 0; id < run.producers; ++id)
    threads.emplace_back([&, id] {
      typename Queue::Producer producer(queue, id);
      auto& seen = observed[static_cast<size_t>(id)].count;
      for (uint64_t i = 0; i < each; ++i) {
        if (!spin_push<Queue>(producer, bench_descriptor(id, i, ticks()), deadline)) return;
        Backoff backoff;
        // acquire: pairs with the consumer's release store below (only the count matters).
        while (seen.load(std::memory_order_acquire) <= i && !deadline.expired())
          backoff.pause();
      }
    });
  std::vector<WireDescriptor> buffer(run.options.burst);
  const uint64_t total = each * static_cast<uint64_t>(run.producers);
  uint32_t empty_polls = 0;
  for (uint64_t received = 0; received < total;) {
    const size_t n = consumer.pop(buffer);
    if (n == 0) {
      idle(run.options.poll_pause, empty_polls);
      if (empty_polls % 4096 == 0 && deadline.expired()) break;
      continue;
    }
    const uint64_t now = ticks();
    for (size_t i = 0; i < n; ++i) {
      samples.push_back(now - buffer[i].cookie);
      auto& seen = observed[buffer[i].dst_rank].count;
      // release: pairs with the producer's acquire load of its count above.
      seen.store(seen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    received += n;
  }
  for (auto& thread : threads)
    thread.join();
  require(!deadline.expired(), "bench.ring", "{}: latency run passed its deadline", Queue::kName);
}

// One repetition of `Queue`: a throughput run and a latency run. Rep 0 warms up.
template <typename Queue>
void measure_rep(const Run& run, int rep, Series& series) {
  std::vector<uint64_t> loaded, paced;
  loaded.reserve(run.options.ops / kStampEvery + 1);
  paced.reserve(run.options.latency_samples + 1);
  const double rate = throughput_rep<Queue>(run, loaded);
  latency_rep<Queue>(run, paced);
  if (rep == 0) return;
  series.ops_per_s.push_back(rate);
  series.loaded_ticks.insert(series.loaded_ticks.end(), loaded.begin(), loaded.end());
  series.paced_ticks.insert(series.paced_ticks.end(), paced.begin(), paced.end());
}

bool wants(const RingBenchOptions& options, std::string_view queue) {
  return std::find(options.queues.begin(), options.queues.end(), queue) != options.queues.end();
}

// The series of one producer count: the ring in both modes (single-producer only with one
// producer) and moodycamel.
struct Row {
  Series mpsc, spsc, moodycamel;
};

nlohmann::json report(const Series& series, double ns_per_tick) {
  auto to_ns = [ns_per_tick](const std::vector<uint64_t>& ticks) {
    std::vector<double> ns;
    ns.reserve(ticks.size());
    for (uint64_t t : ticks)
      ns.push_back(static_cast<double>(t) * ns_per_tick);
    return summarize(ns);
  };
  const Summary rate = summarize(series.ops_per_s);
  const Summary paced = to_ns(series.paced_ticks);
  const Summary loaded = to_ns(series.loaded_ticks);
  return {{"ops_per_s", rate.p50},
          {"ops_per_s_min", rate.min},
          {"ops_per_s_max", rate.max},
          {"latency_ns_p50", paced.p50},
          {"latency_ns_p99", paced.p99},
          {"latency_samples", paced.count},
          {"loaded_latency_ns_p50", loaded.p50},
          {"loaded_latency_ns_p99", loaded.p99},
          {"loaded_latency_samples", loaded.count}};
}

}  // namespace

nlohmann::json run_ring_bench(const RingBenchOptions& options) {
  require(options.ops > 0 && options.reps > 0 && options.burst > 0 && options.push_burst > 0 &&
              options.latency_samples > 0,
          "bench.ring", "ops, reps, burst and latency samples must be positive");
  require(gpu_side::is_power_of_two(options.capacity) && options.capacity >= 2, "bench.ring",
          "--capacity {} must be a power of two >= 2", options.capacity);
  for (const std::string& queue : options.queues)
    require(queue == "ring" || queue == "ring_spsc" || queue == "moodycamel", "bench.ring",
            "--queues: unknown queue '{}' (ring, ring_spsc, moodycamel)", queue);
  TickRate rate;
  std::vector<Row> rows(options.producers.size());
  for (size_t i = 0; i < options.producers.size(); ++i) {
    const int producers = options.producers[i];
    require(producers >= 1 && producers <= 64, "bench.ring", "--producers {} out of 1..64",
            producers);
    // The queues take turns repetition by repetition, so a burst of load from other processes
    // on this shared machine hits all of them alike instead of one queue's whole series.
    const Run run{options, producers};
    for (int rep = 0; rep <= options.reps; ++rep) {
      if (wants(options, "ring")) measure_rep<ring_bench::MpscRingQueue>(run, rep, rows[i].mpsc);
      if (producers == 1 && wants(options, "ring_spsc"))
        measure_rep<ring_bench::SpscRingQueue>(run, rep, rows[i].spsc);
      if (wants(options, "moodycamel"))
        measure_rep<ring_bench::MoodycamelQueue>(run, rep, rows[i].moodycamel);
    }
  }
  const double ns_per_tick = rate.ns_per_tick();
  auto results = nlohmann::json::array();
  for (size_t i = 0; i < options.producers.size(); ++i) {
    nlohmann::json row = {{"producers", options.producers[i]}};
    if (!rows[i].mpsc.ops_per_s.empty()) row["ring"] = report(rows[i].mpsc, ns_per_tick);
    if (!rows[i].spsc.ops_per_s.empty()) row["ring_spsc"] = report(rows[i].spsc, ns_per_tick);
    if (!rows[i].moodycamel.ops_per_s.empty()) {
      row["moodycamel"] = report(rows[i].moodycamel, ns_per_tick);
      const double moodycamel_rate = row["moodycamel"]["ops_per_s"].get<double>();
      for (const char* queue : {"ring", "ring_spsc"})
        if (row.contains(queue))
          row[fmt::format("{}_over_moodycamel", queue)] =
              row[queue]["ops_per_s"].get<double>() / moodycamel_rate;
    }
    results.push_back(std::move(row));
  }
  return {{"benchmark", "ring"},
          {"capacity", options.capacity},
          {"burst", options.burst},
          {"ops", options.ops},
          {"reps", options.reps},
          {"latency_samples", options.latency_samples},
          {"stamp_every", kStampEvery},
          {"poll_pause", options.poll_pause},
          {"push_burst", options.push_burst},
          {"spsc_fence", options.spsc_fence},
          {"queues", options.queues},
          {"cpus", std::thread::hardware_concurrency()},
          {"results", results}};
}

void print_ring_bench(const nlohmann::json& r) {
  fmt::print(
      "ring benchmark: capacity {}, burst {}, {} descriptors x {} reps, {} latency samples per "
      "rep, {} CPUs\n",
      r["capacity"].get<uint64_t>(), r["burst"].get<size_t>(), r["ops"].get<uint64_t>(),
      r["reps"].get<int>(), r["latency_samples"].get<uint64_t>(), r["cpus"].get<unsigned>());
  fmt::print("{:>9} {:>11} {:>10} {:>8} {:>8} {:>10} {:>10} {:>12} {:>12}\n", "producers", "queue",
             "Mops/s p50", "min", "max", "lat p50ns", "lat p99ns", "loaded p50us", "loaded p99us");
  for (const auto& row : r["results"]) {
    for (const char* queue : {"ring", "ring_spsc", "moodycamel"}) {
      if (!row.contains(queue)) continue;
      const auto& q = row[queue];
      fmt::print(
          "{:>9} {:>11} {:>10.1f} {:>8.1f} {:>8.1f} {:>10.0f} {:>10.0f} {:>12.1f} {:>12.1f}\n",
          row["producers"].get<int>(), queue, q["ops_per_s"].get<double>() / 1e6,
          q["ops_per_s_min"].get<double>() / 1e6, q["ops_per_s_max"].get<double>() / 1e6,
          q["latency_ns_p50"].get<double>(), q["latency_ns_p99"].get<double>(),
          q["loaded_latency_ns_p50"].get<double>() / 1e3,
          q["loaded_latency_ns_p99"].get<double>() / 1e3);
    }
  }
  fmt::print("ring: multi-producer mode; ring_spsc: single-producer mode ({}).\n",
             r.value("spsc_fence", false) ? "locked exchange per publish" : "membarrier doorbell");
  const auto cpus = r["cpus"].get<unsigned>();
  for (const auto& row : r["results"])
    if (static_cast<unsigned>(row["producers"].get<int>()) + 1 > cpus)
      fmt::print("note: {} producers + 1 consumer threads on {} CPUs are oversubscribed\n",
                 row["producers"].get<int>(), cpus);
}

void register_bench_ring(CLI::App& bench, Action& action) {
  auto options = std::make_shared<RingBenchOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd =
      bench.add_subcommand("ring",
                           "descriptor ring (multi- and, with 1 producer, single-producer mode) vs "
                           "moodycamel::ConcurrentQueue: descriptors/s and latency");
  cmd->add_option("--producers", options->producers, "producer thread counts to run")
      ->capture_default_str();
  cmd->add_option("--ops", options->ops, "descriptors per throughput repetition")
      ->capture_default_str();
  cmd->add_option("--reps", options->reps, "repetitions (after one warm-up)")
      ->capture_default_str();
  cmd->add_option("--capacity", options->capacity, "ring slots (power of two)")
      ->capture_default_str();
  cmd->add_option("--burst", options->burst, "descriptors per consumer pop")->capture_default_str();
  cmd->add_option("--push-burst", options->push_burst,
                  "descriptors per producer push in throughput runs (1: single pushes)")
      ->capture_default_str();
  cmd->add_option("--poll-pause", options->poll_pause,
                  "spin-loop pauses of the consumer after an empty poll (both queues)")
      ->capture_default_str();
  cmd->add_option("--queues", options->queues,
                  "queues to run: ring (multi-producer mode), ring_spsc (single-producer mode, "
                  "1 producer only), moodycamel")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--spsc-fence", options->spsc_fence,
                "ring_spsc pays a locked exchange per publish (the fallback without membarrier)");
  cmd->add_option("--latency-samples", options->latency_samples,
                  "paced enqueue-to-observed samples per repetition")
      ->capture_default_str();
  cmd->add_option("--timeout-ms", options->timeout_ms, "deadline of every wait")
      ->capture_default_str();
  cmd->add_flag("--json", *json, "print one JSON document on stdout");
  auto gpu = std::make_shared<RingGpuFlags>();
  cmd->add_flag("--gpu", gpu->enabled,
                "a CUDA kernel produces instead (--ops, --reps, --capacity, --burst, "
                "--latency-samples, --timeout-ms apply): GPU-to-CPU descriptors/s and latency; "
                "exits 77 when no CUDA device is usable");
  cmd->add_option("--gpu-blocks", gpu->blocks,
                  "--gpu: thread blocks pushing (0: one per multiprocessor)")
      ->capture_default_str();
  cmd->add_option("--gpu-threads", gpu->threads, "--gpu: threads per block")->capture_default_str();
  cmd->callback([options, json, gpu, cmd, &action] {
    action = [options, json, gpu, cmd] {
      check_ring_gpu_flags(*cmd, gpu->enabled);
      if (gpu->enabled) return bench_ring_gpu_command(*options, *gpu, *json);
      auto results = run_ring_bench(*options);
      if (*json)
        fmt::print("{}\n", results.dump(2));
      else
        print_ring_bench(results);
      return 0;
    };
  });
}

}  // namespace proxyep::tools
