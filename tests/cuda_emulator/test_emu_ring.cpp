// The GPU ring producer on the emulator (tests/cuda_emulator), as tests/gpu/test_gpu_ring.cpp
// runs it on a device, but in memory the fake runtime maps (HostMemory + cudaHostRegister), so
// every slot store the kernels make is checked against the publication rules: payload, then
// __threadfence_system, then the release store of seq. Three parts:
//   selftest    RingSelftest's blocks x threads push concurrently; a host RingConsumer checks
//               every descriptor arrives once and intact (a small ring: many laps, threads
//               waiting for slots; a larger one);
//   ring_push   launch_ring_push's stream-ordered batches (1, 5, 37, 256), slot by slot;
//   bench       the `proxyep bench ring --gpu` kernels (throughput and latency), driven as
//               tools/bench/ring_gpu_bench.cpp drives them, at a small size.
#include "common/deadline.hpp"
#include "gpu_side/cuda/ring_bench_kernel.hpp"
#include "gpu_side/cuda/ring_push.hpp"
#include "gpu_side/cuda/ring_selftest.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"

#include "tests/cuda_emulator/emu_support.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::cuemu_testing;
using namespace std::chrono_literals;
namespace gpu = proxyep::gpu_side::cuda;

namespace {

constexpr uint64_t kKernelTimeoutNs = 10'000'000'000;  // any one wait of a GPU thread

bool same(const Descriptor& a, const Descriptor& b) {
  return a.op == b.op && a.flags == b.flags && a.dst_rank == b.dst_rank &&
         a.local_region == b.local_region && a.remote_region == b.remote_region &&
         a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length &&
         a.cookie == b.cookie && a.imm == b.imm;
}

bool report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  return ok;
}

// RingSelftest into a mapped ring; every descriptor received once, intact, none given up.
bool selftest(uint64_t capacity, const gpu::SelftestConfig& config) {
  MappedMemory memory(Ring::bytes_for(capacity));
  Ring ring = Ring::create(memory.bytes(), capacity);
  RingConsumer consumer(ring);
  RingWaiter waiter(consumer, nullptr, {.timed_sleep = 5us});  // a GPU rings no doorbell
  gpu::RingSelftest test(memory.device(), capacity, config);
  const uint64_t total = uint64_t{config.blocks} * config.per_block;
  std::vector<bool> seen(total, false);
  uint64_t received = 0, corrupt = 0, wrong = 0, duplicate = 0;
  std::vector<WireDescriptor> burst(64);
  const auto start = Deadline::Clock::now();
  test.launch();
  const Deadline deadline(60s);
  while (received + corrupt + wrong + duplicate < total) {
    // In short waits, so a fault the emulator reports (which ends the kernel) ends this too.
    if (cudaPeekAtLastError() != cudaSuccess || deadline.expired()) break;
    const Status waited = waiter.wait(Deadline::after_ms(100));
    if (waited == Status::timeout) continue;
    if (waited != Status::ok || consumer.health() != Status::ok) break;
    const size_t n = consumer.pop_burst(burst);
    for (size_t i = 0; i < n; ++i) {
      Descriptor d;
      if (decode(burst[i], d) != DecodeResult::ok) {
        ++corrupt;
        continue;
      }
      if (d.cookie >= total ||
          !same(d, gpu::selftest_descriptor(static_cast<uint32_t>(d.cookie / config.per_block),
                                            d.cookie % config.per_block, config.per_block))) {
        ++wrong;
        continue;
      }
      if (seen[d.cookie]) {
        ++duplicate;
        continue;
      }
      seen[d.cookie] = true;
      ++received;
    }
  }
  // Bounded without a deadline of ours: a thread waits timeout_ns at most for a slot, and once one
  // gave up the others return at once (the ring is marked abandoned). Throws on a fault.
  const uint64_t gave_up = test.finish();
  const double seconds = std::chrono::duration<double>(Deadline::Clock::now() - start).count();
  char text[256];
  std::snprintf(text, sizeof(text),
                "selftest: capacity %llu, %u blocks x %u threads, %llu descriptors: received "
                "%llu, corrupt %llu, wrong %llu, duplicate %llu, gave up %llu (%.2f s)",
                static_cast<unsigned long long>(capacity), config.blocks, config.threads_per_block,
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(received),
                static_cast<unsigned long long>(corrupt), static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>(duplicate),
                static_cast<unsigned long long>(gave_up), seconds);
  return report(received == total && corrupt == 0 && wrong == 0 && duplicate == 0 && gave_up == 0 &&
                    consumer.health() == Status::ok && !consumer.ready(),
                text);
}

// launch_ring_push: batches queued back to back on one stream land at consecutive positions, in
// order, each slot's seq its position + 1, and the header's producer head counts them all.
bool ring_push_batches() {
  constexpr uint64_t kCapacity = 512;
  constexpr std::array<int64_t, 4> kBatches = {1, 5, 37, 256};
  constexpr int64_t kTotal = 1 + 5 + 37 + 256;
  MappedMemory memory(Ring::bytes_for(kCapacity));
  Ring ring = Ring::create(memory.bytes(), kCapacity);
  RingConsumer consumer(ring);
  std::vector<Descriptor> host(kTotal);
  for (int64_t i = 0; i < kTotal; ++i)
    host[static_cast<size_t>(i)] = gpu::selftest_descriptor(3, static_cast<uint64_t>(i), kTotal);
  const DeviceArray<Descriptor> descriptors(host);
  DeviceArray<gpu::RingPushCounters> counters(1);
  Stream stream;
  auto* header = static_cast<RingHeader*>(memory.device());
  int64_t first = 0;
  for (int64_t batch : kBatches) {
    check(gpu::launch_ring_push(header, kCapacity, counters.get(), descriptors.get() + first, batch,
                                kKernelTimeoutNs, stream),
          "launch_ring_push");
    first += batch;
  }
  if (!settle(stream, Deadline(30s))) return report(false, "ring_push: the stream hung");
  uint64_t bad = 0;
  for (int64_t p = 0; p < kTotal; ++p) {
    const WireDescriptor& slot = ring.slot(static_cast<uint64_t>(p));
    Descriptor d;
    bad += slot.seq != static_cast<uint64_t>(p) + 1 || decode(slot, d) != DecodeResult::ok ||
           !same(d, host[static_cast<size_t>(p)]);
  }
  const uint64_t head = std::atomic_ref<uint64_t>(ring.header().producer.head).load();
  gpu::RingPushCounters device_counters{};
  check(
      cudaMemcpy(&device_counters, counters.get(), sizeof(device_counters), cudaMemcpyDeviceToHost),
      "cudaMemcpy(counters)");
  std::vector<WireDescriptor> out(kCapacity);
  const size_t popped = consumer.pop_burst(out);
  // An empty batch queues nothing.
  check(gpu::launch_ring_push(header, kCapacity, counters.get(), descriptors.get(), 0,
                              kKernelTimeoutNs, stream),
        "launch_ring_push(0)");
  char text[200];
  std::snprintf(text, sizeof(text),
                "ring_push: batches 1, 5, 37, 256: %llu bad slots, header head %llu, device head "
                "%llu, popped %zu of %lld",
                static_cast<unsigned long long>(bad), static_cast<unsigned long long>(head),
                static_cast<unsigned long long>(device_counters.head), popped,
                static_cast<long long>(kTotal));
  return report(bad == 0 && head == kTotal && device_counters.head == kTotal && popped == kTotal &&
                    consumer.health() == Status::ok && !consumer.ready(),
                text);
}

// A batch larger than the free part of the ring: its threads wait for slots the host frees.
bool ring_push_laps() {
  constexpr uint64_t kCapacity = 64;
  constexpr int64_t kCount = 256;
  MappedMemory memory(Ring::bytes_for(kCapacity));
  Ring ring = Ring::create(memory.bytes(), kCapacity);
  RingConsumer consumer(ring);
  std::vector<Descriptor> host(kCount);
  for (int64_t i = 0; i < kCount; ++i)
    host[static_cast<size_t>(i)] = gpu::selftest_descriptor(5, static_cast<uint64_t>(i), kCount);
  const DeviceArray<Descriptor> descriptors(host);
  DeviceArray<gpu::RingPushCounters> counters(1);
  Stream stream;
  check(gpu::launch_ring_push(static_cast<RingHeader*>(memory.device()), kCapacity, counters.get(),
                              descriptors.get(), kCount, kKernelTimeoutNs, stream),
        "launch_ring_push");
  uint64_t received = 0, bad = 0;
  std::vector<WireDescriptor> out(16);
  const Deadline deadline(30s);
  while (received < kCount && !deadline.expired() && consumer.health() == Status::ok) {
    const size_t n = consumer.pop_burst(out);
    for (size_t i = 0; i < n; ++i, ++received) {
      Descriptor d;
      bad += decode(out[i], d) != DecodeResult::ok || !same(d, host[received]);
    }
    if (n == 0) std::this_thread::sleep_for(5us);
  }
  const bool settled = settle(stream, Deadline(30s));
  char text[160];
  std::snprintf(text, sizeof(text),
                "ring_push: 256 descriptors through a 64-slot ring: received %llu, bad %llu",
                static_cast<unsigned long long>(received), static_cast<unsigned long long>(bad));
  return report(settled && received == kCount && bad == 0 && consumer.health() == Status::ok, text);
}

std::atomic_ref<uint64_t> word(gpu::ControlWord& w) {
  return std::atomic_ref<uint64_t>(w.value);
}

// Polls until `ready()` or the deadline; false on the deadline.
template <typename Ready>
bool poll(Ready&& ready, const Deadline& deadline) {
  while (!ready()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(5us);
  }
  return true;
}

// Waits for the bench kernel to end (its waits all have timeouts, so it does); how many of its
// threads gave up. Throws when it faulted or did not end in time.
uint64_t settle_and_finish(gpu::RingBenchKernel& kernel) {
  const Deadline deadline(30s);
  while (!kernel.done()) {
    if (deadline.expired()) throw std::runtime_error("a bench kernel did not end within 30 s");
    std::this_thread::sleep_for(100us);
  }
  return kernel.finish();
}

// The bench kernels as ring_gpu_bench.cpp drives them: the throughput blocks check in, the host
// releases them and sums what it pops; the latency thread answers go words one at a time.
bool bench() {
  constexpr uint64_t kCapacity = 1024;
  constexpr uint32_t kBlocks = 8, kThreads = 64;
  constexpr uint64_t kOps = uint64_t{kBlocks} * kThreads * 8;
  constexpr uint64_t kSamples = 32;
  MappedMemory ring_memory(Ring::bytes_for(kCapacity));
  Ring ring = Ring::create(ring_memory.bytes(), kCapacity);
  RingConsumer consumer(ring);
  MappedMemory control_memory(sizeof(gpu::RingBenchControl));
  auto& control = control_memory.as<gpu::RingBenchControl>();
  gpu::RingBenchKernel kernel(
      ring_memory.device(), kCapacity, control_memory.device(),
      {.blocks = kBlocks, .threads_per_block = kThreads, .timeout_ns = kKernelTimeoutNs});
  bool ok = report(kBlocks <= kernel.max_resident_blocks(), "bench: the blocks fit at once");

  // Throughput.
  kernel.launch_throughput(kOps);
  const Deadline deadline(30s);
  ok &= report(poll([&] { return word(control.arrived).load() == kBlocks; }, deadline),
               "bench throughput: every block checked in");
  word(control.start).store(1, std::memory_order_release);
  uint64_t received = 0, checksum = 0, corrupt = 0;
  std::vector<WireDescriptor> burst(64);
  while (received < kOps && !deadline.expired() && consumer.health() == Status::ok) {
    const size_t n = consumer.pop_burst(burst);
    for (size_t i = 0; i < n; ++i) {
      Descriptor d;
      if (decode(burst[i], d) != DecodeResult::ok)
        ++corrupt;
      else
        checksum += d.src_offset;
    }
    received += n;
    if (n == 0) std::this_thread::sleep_for(5us);
  }
  if (received < kOps) word(control.stop).store(1, std::memory_order_release);  // end it early
  uint64_t gave_up = settle_and_finish(kernel);
  char text[200];
  std::snprintf(text, sizeof(text),
                "bench throughput: %u x %u threads, %llu descriptors: received %llu, corrupt "
                "%llu, checksum %s, gave up %llu",
                kBlocks, kThreads, static_cast<unsigned long long>(kOps),
                static_cast<unsigned long long>(received), static_cast<unsigned long long>(corrupt),
                checksum == kOps * (kOps - 1) / 2 ? "ok" : "WRONG",
                static_cast<unsigned long long>(gave_up));
  ok &= report(received == kOps && corrupt == 0 && checksum == kOps * (kOps - 1) / 2 &&
                   gave_up == 0 && !consumer.ready(),
               text);

  // Latency: odd go words ask for an echo, even ones for descriptor i.
  for (gpu::ControlWord* w :
       {&control.start, &control.stop, &control.arrived, &control.go, &control.echo})
    word(*w).store(0, std::memory_order_relaxed);  // before the launch, which orders them
  kernel.launch_latency(kSamples);
  const Deadline latency_deadline(30s);
  uint64_t answered = 0;
  if (poll([&] { return word(control.arrived).load() == 1; }, latency_deadline)) {
    std::array<WireDescriptor, 1> slot;
    for (; answered < kSamples; ++answered) {
      const uint64_t i = answered;
      word(control.go).store(2 * i + 1, std::memory_order_release);
      if (!poll([&] { return word(control.echo).load(std::memory_order_acquire) == 2 * i + 1; },
                latency_deadline))
        break;
      word(control.go).store(2 * i + 2, std::memory_order_release);
      if (!poll([&] { return consumer.pop_burst(slot) == 1; }, latency_deadline)) break;
      Descriptor d;
      if (decode(slot[0], d) != DecodeResult::ok || d.cookie != i) break;
    }
  }
  if (answered < kSamples) word(control.go).store(gpu::kGoStop, std::memory_order_release);
  gave_up = settle_and_finish(kernel);
  std::snprintf(text, sizeof(text), "bench latency: %llu of %llu samples answered, gave up %llu",
                static_cast<unsigned long long>(answered),
                static_cast<unsigned long long>(kSamples),
                static_cast<unsigned long long>(gave_up));
  ok &= report(answered == kSamples && gave_up == 0 && !consumer.ready(), text);
  return ok;
}

}  // namespace

int main() {
  return proxyep::cuemu_testing::run_program([] {
    // Many laps of a small ring (threads wait for slots), then a larger one.
    bool ok = selftest(
        256,
        {.blocks = 8, .threads_per_block = 64, .per_block = 2048, .timeout_ns = kKernelTimeoutNs});
    ok &= selftest(1 << 14, {.blocks = 16,
                             .threads_per_block = 128,
                             .per_block = 2048,
                             .timeout_ns = kKernelTimeoutNs});
    ok &= ring_push_batches();
    ok &= ring_push_laps();
    ok &= bench();
    return ok;
  });
}
