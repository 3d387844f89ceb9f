// Byte layout of a descriptor ring in memory that every party maps: the creating process, a CPU
// producer in another process (memfd) and a GPU (mapped pinned memory). Shared by host and CUDA
// code; the protocol that runs on it is described in ring.hpp.
//
//   offset                size              what
//        0                 128              RingConfig     written once by Ring::create
//      128                 128              ProducerState  head (fetch-added by every producer, or
//                                                          stored by the single producer), the
//                                                          single-producer claim and sync mode
//      256                 128              ConsumerState  tail and retired prefix, published by
//                                                          the consumer
//      384                 128              SignalState    consumer_sleeping, abandoned
//      512    64 * capacity              slots          WireDescriptor[capacity]
//
// The memory holds no pointers, only sizes and offsets, so each party uses its own mapping.
#pragma once

#include "gpu_side/descriptor.hpp"

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side {

inline constexpr uint32_t kRingMagic = 0x52504550u;  // "PEPR" read as little-endian bytes
// 2: RingConfig::producer_mode and ProducerState::attached/sync. A version-1 build must not
// attach: it would fetch-add the head of a single-producer ring behind its producer's back.
// 3: ConsumerState::retired, which a producer in another process (a client of the node daemon)
// reads to know when the source of a write may be reused, and ProducerState::waiting, which keeps
// that process's consumer awake while the producer waits; a version-2 consumer knows neither.
inline constexpr uint32_t kRingLayoutVersion = 3;
// Producer and consumer state are kept this far apart, not merely a cache line: Intel's
// adjacent-line prefetcher pulls lines in 128-byte pairs, so state 64 B apart still false-shares
// (DPDK's rte_ring pads the same way).
inline constexpr size_t kFalseSharingRange = 128;

// Who may push into a ring; fixed by Ring::create (ring.hpp describes both protocols).
enum class ProducerMode : uint32_t {
  multi = 0,   // any number of producers reserve positions with a fetch-add of head (default)
  single = 1,  // one RingProducer at a time (claimed in ProducerState), no atomic RMW per push
};

// ProducerState::sync: how the single producer orders its head store before its load of
// consumer_sleeping (the doorbell's Dekker pair, ring.hpp).
inline constexpr uint32_t kSyncFence = 0;    // a locked exchange of head per publish
inline constexpr uint32_t kSyncBarrier = 1;  // no fence; the consumer runs membarrier() instead

// Written once by Ring::create before the memory is shared; read by Ring::attach.
struct alignas(kFalseSharingRange) RingConfig {
  uint32_t magic;
  uint32_t layout_version;
  uint32_t descriptor_version;
  uint32_t slot_bytes;
  uint64_t capacity;      // slots, a power of two
  uint64_t slots_offset;  // bytes from the start of the header to slot 0
  uint64_t total_bytes;   // header + slots
  ProducerMode producer_mode;
};

// Written by every host producer's reservation (fetch-add), or by the single producer's publish
// (plain store); read by the consumer only when it is about to sleep (and by quiet waiters). A
// GPU producer keeps its own head in device memory (ring_producer.cuh).
struct alignas(kFalseSharingRange) ProducerState {
  uint64_t head;
  uint32_t attached;  // single-producer rings: 1 while a RingProducer holds the ring
  uint32_t sync;      // single-producer rings: kSyncFence or kSyncBarrier, set by the producer
  // 1 while the producer's process waits on what the consumer does (a node daemon's client in
  // a wait: RingProducer::set_waiting): the consumer keeps polling instead of sleeping.
  uint32_t waiting;
};

// Written by the consumer once per non-empty burst; read by producers only when their cached
// copy says the ring is full.
struct alignas(kFalseSharingRange) ConsumerState {
  uint64_t tail;      // every position below tail has been copied out: its slot is free
  uint32_t attached;  // 1 while a RingConsumer holds the ring (single-consumer guard)
  uint32_t reserved;
  // Every descriptor below this position has finished: its write completed locally (or failed),
  // so the memory it read may be rewritten. Stored (release) by the proxy that drains the ring
  // (proxy/engine/ring_lane.hpp) as its in-order prefix advances; producers that cannot ask that
  // proxy directly (another process) load it (acquire).
  uint64_t retired;
};

// Read by producers after every publish; written rarely.
struct alignas(kFalseSharingRange) SignalState {
  uint32_t consumer_sleeping;  // 1: the consumer found the ring empty and may block (doorbell)
  uint32_t reserved;
  uint64_t abandoned;  // 0, or 1 + a position whose producer gave up: the consumer stalls there
};

struct RingHeader {
  RingConfig config;
  ProducerState producer;
  ConsumerState consumer;
  SignalState signal;
};

static_assert(sizeof(RingHeader) == 4 * kFalseSharingRange,
              "RingHeader must be four 128-byte blocks: config, producer, consumer, signal");
static_assert(offsetof(RingHeader, producer) == 1 * kFalseSharingRange &&
                  offsetof(RingHeader, consumer) == 2 * kFalseSharingRange &&
                  offsetof(RingHeader, signal) == 3 * kFalseSharingRange,
              "producer, consumer and signal state must each start a 128-byte block, or a "
              "producer's fetch-add and the consumer's tail store false-share");
static_assert(sizeof(RingHeader) % alignof(WireDescriptor) == 0,
              "slots start right after the header and must stay cache-line aligned");

inline constexpr uint64_t kRingSlotsOffset = sizeof(RingHeader);

// Bytes a ring of `capacity` slots occupies.
PROXYEP_HOST_DEVICE constexpr uint64_t ring_bytes(uint64_t capacity) {
  return kRingSlotsOffset + capacity * sizeof(WireDescriptor);
}

PROXYEP_HOST_DEVICE constexpr bool is_power_of_two(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

// Slot array of the ring whose header is at `header` (in the caller's own mapping).
PROXYEP_HOST_DEVICE inline WireDescriptor* ring_slots(RingHeader* header) {
  return reinterpret_cast<WireDescriptor*>(reinterpret_cast<char*>(header) + kRingSlotsOffset);
}

}  // namespace proxyep::gpu_side
