// GPU producer for a descriptor ring in mapped pinned host memory (gpu_side/pinned_memory.hpp).
//
// The slot protocol and the encode() are the host producer's (ring.hpp, descriptor.hpp); what
// changes is where each word lives, because every access to host memory crosses PCIe:
//   head         the reservation counter. By default in device memory: a GPU atomic there
//                takes nanoseconds, while on mapped host memory each one is a PCIe round trip,
//                and CUDA does not make it atomic with respect to the CPU anyway, so a ring
//                with a GPU producer has no host producers. Accessed at system scope, so it may
//                also point at the header's producer.head.
//   cached_tail  device-memory copy of the consumer's tail (NCCL GIN's cisShadow): a thread
//                reads the host tail across PCIe only when the copy says its slot is still in
//                use, and publishes what it read for the other threads (fetch_max).
//   slot         bytes 8..63 with seven volatile 64-bit stores, __threadfence_system(), then a
//                system-scope release store of seq = p + 1.
// A kernel must not hang on a dead proxy: after timeout_ns a thread marks its position
// abandoned in the header (RingConsumer::health() -> peer_failed) and returns false; a thread
// waiting for a slot of a ring marked abandoned returns false at once.
// No doorbell: a GPU cannot write an eventfd; its consumer polls with timed sleeps
// (RingWaiter without a doorbell).
#pragma once

#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring_layout.hpp"

#include <cuda/atomic>

#include <cstdint>

namespace proxyep::gpu_side::cuda {

// Device-side handle of one ring; trivially copyable, passed to kernels by value.
struct DeviceRing {
  RingHeader* header;     // device address of the ring header (mapped pinned memory)
  WireDescriptor* slots;  // device address of slot 0
  uint64_t capacity;      // a power of two
  uint64_t* head;         // reservation counter (device memory, or &header->producer.head)
  uint64_t* cached_tail;  // device-memory copy of header->consumer.tail
};

__device__ inline bool device_slot_free(const DeviceRing& ring, uint64_t position) {
  const auto capacity = static_cast<int64_t>(ring.capacity);
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device> cached(*ring.cached_tail);
  // acquire (device scope): pairs with another thread's release fetch_max below, which carries
  // that thread's system-scope acquire of the host tail to us.
  if (static_cast<int64_t>(position - cached.load(::cuda::memory_order_acquire)) < capacity)
    return true;
  // acquire (system scope): pairs with the consumer's release store of tail in
  // RingConsumer::pop_burst(): its copies of the slot's previous lap are done.
  const uint64_t tail =
      ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(ring.header->consumer.tail)
          .load(::cuda::memory_order_acquire);
  // release (device scope): pairs with the acquire load of the cached copy above.
  cached.fetch_max(tail, ::cuda::memory_order_release);
  return static_cast<int64_t>(position - tail) < capacity;
}

// Writes the payload words (bytes 8..63) of `image` into `slot`, then publishes seq.
__device__ inline void device_publish(WireDescriptor* slot, const WireDescriptor& image) {
  uint64_t words[kDescriptorBytes / sizeof(uint64_t)];
  memcpy(words, &image, sizeof(words));
  volatile uint64_t* out = reinterpret_cast<volatile uint64_t*>(slot);
  for (int i = 1; i < static_cast<int>(kDescriptorBytes / sizeof(uint64_t)); ++i)
    out[i] = words[i];
  // The payload must reach host memory before seq does: the proxy reads it right after seq.
  __threadfence_system();
  // release (system scope): pairs with the consumer's acquire load of seq in
  // RingConsumer::pop_burst() and ready().
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(slot->seq).store(
      image.seq, ::cuda::memory_order_release);
}

// Whether a producer gave up on the ring (it is dead: nothing waits for it any more).
__device__ inline bool device_ring_abandoned(const DeviceRing& ring) {
  // acquire (system scope): pairs with the release compare-exchange below, another thread's.
  return ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(ring.header->signal.abandoned)
             .load(::cuda::memory_order_acquire) != 0;
}

// Publishes `d` at `position` (taken by the caller) once the consumer freed its slot; false when
// it freed none for `timeout_ns` (the position is then marked abandoned and the ring is dead),
// or at once, while it waits, once another producer marked the ring abandoned: a batch and the
// pushes after it cost one timeout on a dead ring, not one per descriptor.
__device__ inline bool device_push_at(const DeviceRing& ring, const Descriptor& d,
                                      uint64_t position, uint64_t timeout_ns) {
  if (!device_slot_free(ring, position)) {
    const uint64_t start = global_timer_ns();
    do {
      if (device_ring_abandoned(ring)) return false;
      if (global_timer_ns() - start > timeout_ns) {
        // release (system scope): pairs with the acquire load of abandoned in
        // RingConsumer::health(). From 0 only: the first position that stalled stays named.
        uint64_t none = 0;
        ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(ring.header->signal.abandoned)
            .compare_exchange_strong(none, position + 1, ::cuda::memory_order_release,
                                     ::cuda::memory_order_relaxed);
        return false;
      }
      __nanosleep(200);  // a PCIe read per poll is expensive; let the proxy catch up
    } while (!device_slot_free(ring, position));
  }
  device_publish(&ring.slots[position & (ring.capacity - 1)], encode(d, position + 1));
  return true;
}

// Pushes `d` at the next position; false as device_push_at.
__device__ inline bool device_push(const DeviceRing& ring, const Descriptor& d,
                                   uint64_t timeout_ns) {
  // relaxed (system scope, valid for either home of the counter): only takes a position; the
  // slot's contents are ordered by seq, and no doorbell needs the Dekker pair of ring.hpp.
  const uint64_t position = ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*ring.head)
                                .fetch_add(1, ::cuda::memory_order_relaxed);
  return device_push_at(ring, d, position, timeout_ns);
}

}  // namespace proxyep::gpu_side::cuda
