#include "tools/bench/proxy_bench.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/engine/region_exchange.hpp"
#include "proxy/engine/thread_cpu.hpp"
#include "tools/bench/fabric_bench.hpp"
#include "tools/bench/stats.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kRegion = 0;
constexpr uint64_t kRingSlots = 1024;

// One rank's proxy path for one run: a ring its producer (this thread) pushes into, a counter
// bank behind a signal router, and an engine draining the ring. Keys [0, latency keys) count
// ping-pongs (one key per iteration, so every flag is fresh), then the stream and its answer.
class ProxySide {
 public:
  ProxySide(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
            const fabric::MemoryRegion& region, uint32_t keys, size_t window)
      : memory_(HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots))),
        ring_(gpu_side::Ring::create(memory_.bytes(), kRingSlots)),
        bank_(keys),
        peer_(1 - bootstrap.rank()) {
    router_.attach_counters(bank_);
    auto options = proxy::EngineOptions::from_params();
    options.credits.writes = static_cast<uint32_t>(window);
    engine_ = std::make_unique<proxy::ProxyEngine>(fabric, bootstrap.rank(), 2, router_, options);
    proxy::share_region(bootstrap, engine_->regions(), kRegion, region, "bench.proxy");
    engine_->add_ring(ring_, &doorbell_);
    producer_ = std::make_unique<gpu_side::RingProducer>(
        ring_, gpu_side::ProducerOptions{.doorbell = &doorbell_});
  }
  ~ProxySide() { engine_->stop(); }

  proxy::ProxyEngine& engine() { return *engine_; }
  control::CounterBank& bank() { return bank_; }

  void expect(uint32_t key, uint64_t count) {
    if (bank_.set_expected(0, key, count) != Status::ok)
      fail("bench.proxy", "counter setup: {}", bank_.last_error());
  }
  // One write of `size` bytes at `offset` (both sides) to the peer, counted under `key`.
  void send(uint64_t offset, size_t size, uint32_t key, const Deadline& deadline) {
    gpu_side::Descriptor d;
    d.op = size == 0 ? gpu_side::Op::signal : gpu_side::Op::write_imm;
    d.dst_rank = static_cast<uint32_t>(peer_);
    d.local_region = kRegion;
    d.remote_region = kRegion;
    d.src_offset = d.dst_offset = size == 0 ? 0 : offset;
    d.length = size;
    d.imm = control::imm::encode_counter(0, key);
    if (producer_->push(d, deadline) != Status::ok)
      fail("bench.proxy", "the ring stayed full until the deadline (proxy stuck?)");
  }
  void wait(uint32_t key, const Deadline& deadline, const char* what) {
    engine_->wait_flag(bank_, 0, key, deadline, what);
  }

 private:
  HostMemory memory_;
  gpu_side::Ring ring_;
  gpu_side::Doorbell doorbell_;
  control::CounterBank bank_;
  control::SignalRouter router_;
  int peer_;
  std::unique_ptr<proxy::ProxyEngine> engine_;
  std::unique_ptr<gpu_side::RingProducer> producer_;
};

struct RunResult {
  Summary raw_latency, proxy_latency;
  double raw_writes_per_s = 0, proxy_descriptors_per_s = 0;
};

Summary proxy_latency(ProxySide& side, int rank, const ProxyBenchOptions& o) {
  int warmup = std::max(1, o.latency_iters / 10);
  std::vector<double> samples;
  auto deadline = Deadline::after_ms(o.timeout_ms);
  for (int i = 0; i < warmup + o.latency_iters; ++i) {
    auto key = static_cast<uint32_t>(i);
    if (rank == 0) {
      auto start = Clock::now();
      side.send(0, o.size, key, deadline);
      side.wait(key, deadline, "bench.proxy latency: pong");
      auto us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (i >= warmup) samples.push_back(us / 2);
    } else {
      side.wait(key, deadline, "bench.proxy latency: ping");
      side.send(0, o.size, key, deadline);
    }
  }
  return summarize(samples);
}

double proxy_stream(ProxySide& side, int rank, const ProxyBenchOptions& o, uint32_t stream_key,
                    uint32_t ack_key) {
  auto deadline = Deadline::after_ms(o.timeout_ms);
  if (rank == 1) {
    side.wait(stream_key, deadline, "bench.proxy stream: descriptors");
    side.send(0, 0, ack_key, deadline);
    return 0;
  }
  auto start = Clock::now();
  for (size_t i = 0; i < o.stream_writes; ++i)
    side.send((i % o.window) * o.size, o.size, stream_key, deadline);
  side.wait(ack_key, deadline, "bench.proxy stream: answer");
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(o.stream_writes) / seconds;
}

RunResult run_once(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                   const fabric::MemoryRegion& region, const ProxyBenchOptions& o) {
  const int rank = bootstrap.rank();
  RunResult result;
  // Raw: `bench fabric` on this size only, on this thread (no proxy running).
  bootstrap.set_progress([&fabric] { fabric.progress(); });
  FabricBenchOptions raw;
  raw.sizes = {o.size};
  raw.window = o.window;
  raw.bytes_per_rep = o.stream_writes * o.size;
  raw.reps = 1;
  raw.latency_iters = o.latency_iters;
  raw.timeout_ms = o.timeout_ms;
  auto raw_json = run_fabric_bench(bootstrap, fabric, raw);
  if (rank == 0) {
    const auto& row = raw_json["results"][0];
    result.raw_latency.p50 = row["latency_us_p50"].get<double>();
    result.raw_latency.p99 = row["latency_us_p99"].get<double>();
    result.raw_writes_per_s = row["gbps"].get<double>() * 1e9 / static_cast<double>(o.size);
  }
  // Proxy: the engine owns the rails from start() to stop(); the bootstrap must not poll them.
  bootstrap.set_progress({});
  auto keys = static_cast<uint32_t>(o.latency_iters + std::max(1, o.latency_iters / 10));
  ProxySide side(bootstrap, fabric, region, keys + 2, o.window);
  for (uint32_t key = 0; key < keys; ++key)
    side.expect(key, 1);  // rank 1 counts pings, rank 0 pongs
  side.expect(rank == 1 ? keys : keys + 1, rank == 1 ? o.stream_writes : 1);
  side.engine().start();
  bootstrap.barrier("bench.proxy(start)");
  result.proxy_latency = proxy_latency(side, rank, o);
  bootstrap.barrier("bench.proxy(stream)");
  result.proxy_descriptors_per_s = proxy_stream(side, rank, o, keys, keys + 1);
  side.engine().quiet(Deadline::after_ms(o.timeout_ms));
  bootstrap.barrier("bench.proxy(done)");  // both engines keep polling until both are quiet
  return result;
}

// CPU per idle proxy thread (fraction of a core), this rank's threads, over `seconds`.
double idle_cpu(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                const fabric::MemoryRegion& region, const ProxyBenchOptions& o) {
  bootstrap.set_progress({});
  ProxySide side(bootstrap, fabric, region, 1, o.window);
  side.engine().start();
  bootstrap.barrier("bench.proxy(idle)");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past the spin/yield stages
  auto sample = [&] {
    double total = 0;
    for (pid_t tid : side.engine().thread_ids())
      total += proxy::thread_cpu_seconds(tid).value_or(0);
    return total;
  };
  double before = sample();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
  double used = sample() - before;
  bootstrap.barrier("bench.proxy(idle done)");
  return used / o.idle_seconds / std::max(1, side.engine().threads());
}

double median_of(const std::vector<RunResult>& runs, double (*get)(const RunResult&)) {
  std::vector<double> values;
  for (const auto& run : runs)
    values.push_back(get(run));
  return percentile(values, 50);
}

}  // namespace

nlohmann::json run_proxy_bench(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                               const ProxyBenchOptions& o) {
  require(bootstrap.world_size() == 2, "bench.proxy", "needs exactly 2 ranks, got {}",
          bootstrap.world_size());
  require(o.size > 0 && o.runs > 0 && o.latency_iters > 0 && o.window > 0 && o.stream_writes > 0,
          "bench.proxy", "size, runs, iterations, window and stream writes must be positive");
  std::vector<char> buffer(o.window * o.size);
  auto region = fabric.register_memory(buffer.data(), buffer.size());
  std::vector<RunResult> runs;
  for (int run = 0; run < o.runs; ++run)
    runs.push_back(run_once(bootstrap, fabric, *region, o));
  double idle = o.idle_seconds > 0 ? idle_cpu(bootstrap, fabric, *region, o) : 0;
  auto idle_all = bootstrap.allgather(
      std::span(reinterpret_cast<const uint8_t*>(&idle), sizeof(idle)), "bench.proxy(idle cpu)");
  bootstrap.set_progress([&fabric] { fabric.progress(); });
  if (bootstrap.rank() != 0) return nlohmann::json::object();

  nlohmann::json per_run = nlohmann::json::array();
  for (const auto& r : runs)
    per_run.push_back({{"raw_p50_us", r.raw_latency.p50},
                       {"raw_p99_us", r.raw_latency.p99},
                       {"proxy_p50_us", r.proxy_latency.p50},
                       {"proxy_p99_us", r.proxy_latency.p99},
                       {"raw_writes_per_s", r.raw_writes_per_s},
                       {"proxy_descriptors_per_s", r.proxy_descriptors_per_s}});
  double raw_p50 = median_of(runs, [](const RunResult& r) { return r.raw_latency.p50; });
  double raw_p99 = median_of(runs, [](const RunResult& r) { return r.raw_latency.p99; });
  double proxy_p50 = median_of(runs, [](const RunResult& r) { return r.proxy_latency.p50; });
  double proxy_p99 = median_of(runs, [](const RunResult& r) { return r.proxy_latency.p99; });
  std::vector<double> idle_ranks;
  for (const auto& blob : idle_all) {
    double value = 0;
    std::memcpy(&value, blob.data(), std::min(blob.size(), sizeof(value)));
    idle_ranks.push_back(value * 100);
  }
  const auto& caps = fabric.capabilities();
  return {
      {"benchmark", "proxy"},
      {"provider", caps.provider},
      {"size", o.size},
      {"runs", o.runs},
      {"latency_iters", o.latency_iters},
      {"window", o.window},
      {"raw",
       {{"latency_us_p50", raw_p50},
        {"latency_us_p99", raw_p99},
        {"writes_per_s", median_of(runs, [](const RunResult& r) { return r.raw_writes_per_s; })}}},
      {"proxy",
       {{"latency_us_p50", proxy_p50},
        {"latency_us_p99", proxy_p99},
        {"descriptors_per_s",
         median_of(runs, [](const RunResult& r) { return r.proxy_descriptors_per_s; })}}},
      {"ratio_p50", raw_p50 > 0 ? proxy_p50 / raw_p50 : 0},
      {"ratio_p99", raw_p99 > 0 ? proxy_p99 / raw_p99 : 0},
      {"idle_seconds", o.idle_seconds},
      {"idle_cpu_percent_per_thread_by_rank", idle_ranks},
      {"per_run", per_run}};
}

void print_proxy_bench(const nlohmann::json& r) {
  fmt::print("proxy benchmark: provider {}{}, {} B writes, {} runs x {} ping-pongs, window {}\n",
             r["provider"].get<std::string>(), r.value("reorder", false) ? " (reorder shim)" : "",
             r["size"].get<size_t>(), r["runs"].get<int>(), r["latency_iters"].get<int>(),
             r["window"].get<size_t>());
  fmt::print("{:>8} {:>14} {:>14} {:>16}\n", "path", "lat p50 us", "lat p99 us", "writes/s");
  const auto& raw = r["raw"];
  const auto& proxy = r["proxy"];
  fmt::print("{:>8} {:>14.2f} {:>14.2f} {:>16.0f}\n", "raw", raw["latency_us_p50"].get<double>(),
             raw["latency_us_p99"].get<double>(), raw["writes_per_s"].get<double>());
  fmt::print("{:>8} {:>14.2f} {:>14.2f} {:>16.0f}\n", "proxy",
             proxy["latency_us_p50"].get<double>(), proxy["latency_us_p99"].get<double>(),
             proxy["descriptors_per_s"].get<double>());
  fmt::print("proxy / raw: p50 {:.2f}x, p99 {:.2f}x (medians over runs)\n",
             r["ratio_p50"].get<double>(), r["ratio_p99"].get<double>());
  if (r["idle_seconds"].get<double>() > 0) {
    std::vector<std::string> ranks;
    for (const auto& percent : r["idle_cpu_percent_per_thread_by_rank"])
      ranks.push_back(fmt::format("{:.2f} %", percent.get<double>()));
    fmt::print("idle CPU per proxy thread over {} s (rank 0, rank 1): {}\n",
               r["idle_seconds"].get<double>(), fmt::join(ranks, ", "));
  }
}

}  // namespace proxyep::tools
