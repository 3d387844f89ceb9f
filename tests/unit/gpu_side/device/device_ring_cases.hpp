// Descriptor rings pushed by a device's stream (DeviceRuntime::attach_ring / ring_push) on any
// DeviceRuntime: run on the host-simulated device by test_simulated_device.cpp and on CUDA by
// tests/gpu/test_gpu_ring.cpp. Each case returns "" when it held, else what went wrong.
#pragma once

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ring.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::testing::device_ring {

inline constexpr auto kWait = std::chrono::seconds(20);

// A multi-producer ring (the mode a device pushes into) in its own page-aligned memory.
struct OwnRing {
  explicit OwnRing(uint64_t capacity)
      : memory(HostMemory::heap(Ring::bytes_for(capacity))),
        ring(Ring::create(memory.bytes(), capacity)) {}
  HostMemory memory;
  Ring ring;
};

// Descriptor `i` of a batch: every field derived from it, so a swap or a torn slot shows.
inline Descriptor numbered(uint64_t i) {
  Descriptor d;
  d.op = i % 4 == 3 ? Op::signal : Op::write_imm;
  d.dst_rank = static_cast<uint32_t>(i % 17);
  d.local_region = 1;
  d.remote_region = static_cast<uint32_t>(i % 3);
  d.src_offset = (uint64_t{5} << 30) + i * 4096;
  d.dst_offset = i * 8192;
  d.length = d.op == Op::signal ? 0 : 64 + i;
  d.cookie = 0xc0de0000 + i;
  d.imm = static_cast<uint32_t>(i * 2654435761u);
  return d;
}

// Host memory registered with `device` for the case's life.
class Registered {
 public:
  Registered(device::DeviceRuntime& device, std::span<std::byte> memory)
      : device_(device), memory_(memory) {
    device_.register_host(memory_.data(), memory_.size());
  }
  ~Registered() { device_.unregister_host(memory_.data()); }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;

 private:
  device::DeviceRuntime& device_;
  std::span<std::byte> memory_;
};

// `descriptors` in device memory.
inline std::shared_ptr<std::byte[]> on_device(device::DeviceRuntime& device,
                                              const std::vector<Descriptor>& descriptors) {
  const uint64_t bytes = descriptors.size() * sizeof(Descriptor);
  std::shared_ptr<std::byte[]> memory = device.allocate(bytes);
  device.copy(memory.get(), descriptors.data(), bytes);
  return memory;
}

// Two batches through a ring smaller than the first (so the stream waits for the consumer to
// free slots), each queued after a fill of a flag word in registered host memory: a host
// consumer must get every descriptor intact, at consecutive positions, in order, and only after
// the stream passed the fill queued before its batch; the header's head then counts them all.
inline std::string push_in_stream_order_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  constexpr int64_t kFirst = 100, kSecond = 10, kTotal = kFirst + kSecond;
  OwnRing r(64);
  HostMemory flag_memory = HostMemory::heap(4096);
  std::string failure;
  {
    Registered ring_registered(*device, r.memory.bytes());
    Registered flags_registered(*device, flag_memory.bytes());
    auto* flags = reinterpret_cast<uint8_t*>(flag_memory.bytes().data());
    std::vector<Descriptor> wanted;
    for (int64_t i = 0; i < kTotal; ++i)
      wanted.push_back(numbered(static_cast<uint64_t>(i)));
    const std::shared_ptr<std::byte[]> descriptors = on_device(*device, wanted);
    const auto* first = reinterpret_cast<const Descriptor*>(descriptors.get());
    std::unique_ptr<device::DeviceRingProducer> producer = device->attach_ring(r.ring);
    device->fill(flags, 1, 1);
    device->ring_push(*producer, first, kFirst, std::chrono::milliseconds(kWait));
    device->fill(flags + 1, 1, 1);
    device->ring_push(*producer, first + kFirst, kSecond, std::chrono::milliseconds(kWait));

    // The consumer (a proxy thread) beside the host that waits for the stream. It drains the
    // ring to the end even after a mismatch, so the stream finishes its pushes before the ring
    // goes; the first mismatch is the case's failure.
    std::string mismatch;
    std::thread consumer([&] {
      RingConsumer ring(r.ring);
      std::vector<WireDescriptor> out(16);
      int64_t got = 0;
      const Deadline deadline(kWait);
      while (got < kTotal) {
        if (deadline.expired()) {
          mismatch = fmt::format("the consumer got {} of {} descriptors", got, kTotal);
          break;
        }
        const size_t n = ring.pop_burst(out);
        if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
        for (size_t i = 0; i < n; ++i, ++got) {
          const WireDescriptor expected =
              encode(wanted[static_cast<size_t>(got)], static_cast<uint64_t>(got) + 1);
          const uint8_t flag =
              std::atomic_ref<uint8_t>(flags[got < kFirst ? 0 : 1]).load(std::memory_order_relaxed);
          if (!mismatch.empty()) continue;
          if (std::memcmp(&out[i], &expected, sizeof(expected)) != 0)
            mismatch = fmt::format("descriptor {} differs from the one pushed there", got);
          else if (flag != 1)
            mismatch = fmt::format("descriptor {} arrived before the fill queued before it", got);
        }
      }
    });
    try {
      device->synchronize("ring push", kWait);
    } catch (const Error& e) {
      failure = e.what();
    }
    consumer.join();
    if (failure.empty()) failure = mismatch;
    const uint64_t head = atomic(r.ring.header().producer.head).load(std::memory_order_acquire);
    if (failure.empty() && head != static_cast<uint64_t>(kTotal))
      failure = fmt::format("the header's producer head is {}, {} were pushed", head, kTotal);
  }
  return failure;
}

// No consumer: a push into a full ring gives up after its timeout, marks the ring abandoned
// (the consumer's health() reports the producer failed) and leaves the stream usable.
inline std::string abandoned_case(const std::shared_ptr<device::DeviceRuntime>& device) {
  OwnRing r(8);
  Registered ring_registered(*device, r.memory.bytes());
  std::vector<Descriptor> wanted;
  for (uint64_t i = 0; i < 9; ++i)
    wanted.push_back(numbered(i));
  const std::shared_ptr<std::byte[]> descriptors = on_device(*device, wanted);
  std::unique_ptr<device::DeviceRingProducer> producer = device->attach_ring(r.ring);
  device->ring_push(*producer, reinterpret_cast<const Descriptor*>(descriptors.get()), 9,
                    std::chrono::milliseconds(200));
  try {
    device->synchronize("ring push into a full ring", kWait);
  } catch (const Error& e) {
    return fmt::format("the stream failed: {}", e.what());
  }
  RingConsumer consumer(r.ring);
  if (consumer.health() != Status::peer_failed)
    return "a push that gave up left the ring looking healthy";
  // The stream goes on.
  const std::shared_ptr<std::byte[]> scratch = device->allocate(64);
  device->fill(scratch.get(), 0, 64);
  try {
    device->synchronize("after an abandoned ring", kWait);
  } catch (const Error& e) {
    return fmt::format("the stream is unusable after the ring was abandoned: {}", e.what());
  }
  return "";
}

}  // namespace proxyep::gpu_side::testing::device_ring
