// Descriptor ring: many producers, one consumer, in memory that every party maps
// (ring_layout.hpp: a 512-byte header, then `capacity` 64-byte slots; ring_memory.hpp: heap,
// memfd or CUDA mapped pinned memory).
//
// Shape (DPDK rte_ring): free-running 64-bit positions masked on access (2^64 descriptors at
// 1e9/s take 584 years to wrap), capacity a power of two, producer and consumer state 128 bytes
// apart. The memory holds offsets only, never pointers.
//
// Producers: any number of threads, in this process or another one mapping the same memfd. (Or
// the threads of one GPU, cuda/ring_producer.cuh — never mixed with host producers on one ring:
// GPU atomics on mapped host memory are not atomic with respect to the CPU.) Each thread owns a
// RingProducer handle that caches the consumer's tail.
//   1. try_push checks for room first: head - cached tail < capacity, refreshing the cached tail
//      (one shared-line read) only when the cached copy says "full". No room: Status::again,
//      nothing reserved.
//   2. It reserves position p = head.fetch_add(1) (try_push_burst: n positions with one
//      fetch_add(n), which saves a locked instruction per descriptor; see below). Overshoot:
//      producers that pass the room check at the same moment all fetch-add, so p may land up to
//      (producers - 1) past the end of a full ring. A fetch-add cannot be undone without leaving a
//      hole the consumer would wait on forever, so such a producer keeps p and waits for the
//      consumer to free the slot, for at most `stall_timeout`. push() (blocking, with a deadline)
//      reserves first and waits, which makes producers take turns in ticket order.
//   3. Slot p is free once p < tail + capacity. The producer writes bytes 8..63, then stores
//      seq = p + 1 with release. A producer that gives up on a reserved position (timeout) owes
//      it: its next call, flush() or its destructor publishes an Op::nop there once the slot is
//      free, so the consumer never stalls on a hole while the producer lives; a producer that
//      dies owing one leaves `abandoned` set and RingConsumer::health() reports peer_failed.
// Consumer: exactly one RingConsumer at a time (claimed in the header). At position c it acts on
//   a slot only once seq == c + 1 (acquire): a half-written slot, or one from an earlier lap,
//   never matches. pop_burst copies up to N contiguous ready slots out and then publishes
//   tail = c + n, which frees them all for the next lap. A slot is free as soon as it is copied:
//   network flow control lives in the proxy, not here.
//
// Why slots are freed by the tail rather than per slot (the Vyukov queue's seq = c + capacity):
// one tail store per burst instead of one store per slot saves the consumer a write and the
// producer a coherence miss per descriptor, and it is the only scheme a GPU can afford (it checks
// a cached tail instead of reading every slot's seq across PCIe). seq still marks which lap a
// slot holds, and the check word covers seq, so a stale slot never decodes.
//
// Cost: a producer's fetch-add is a locked instruction, which waits until the producer's earlier
// stores (the previous slot) have left its store buffer. When the consumer keeps up, it reads
// each slot right after its publication, so those stores often wait for the line to come back
// from the consumer's cache: one cross-core transfer (~100 ns on a 2-vCPU VM) per push. A
// burst push pays it once per burst; a consumer that pauses after an empty poll lets a batch
// accumulate. (Prefetching slots for writing a few positions ahead made no measurable difference
// here, so the producer does not.)
//
// Memory orders; each use names its partner:
//   producer seq.store(p + 1, release)  -> consumer seq.load(acquire): the payload is visible.
//   consumer tail.store(c, release)     -> producer tail.load(acquire): the consumer's copies of
//                                          slots below c happen before a producer rewrites them.
//   producer head.fetch_add(seq_cst), then consumer_sleeping.load(seq_cst)  <->
//   consumer consumer_sleeping.store(1, seq_cst), then head.load(seq_cst):
//       the doorbell's Dekker pair (store-load on both sides; see doorbell.hpp). Either the
//       consumer sees the reservation and stays awake, or the producer sees it sleeping.
#pragma once

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "gpu_side/backoff.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring_layout.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>

namespace proxyep::gpu_side {

class Doorbell;

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                  std::atomic_ref<uint32_t>::is_always_lock_free,
              "ring words are shared across processes and with a GPU: their atomics must be "
              "lock-free (address-free), never a lock inside libatomic");
static_assert(alignof(uint64_t) >= std::atomic_ref<uint64_t>::required_alignment,
              "a naturally aligned uint64_t in the shared header must be usable by atomic_ref");

template <typename T>
inline std::atomic_ref<T> atomic(T& word) {
  return std::atomic_ref<T>(word);
}

// A view of a ring laid out in memory someone else owns (RingMemory); cheap to copy.
class Ring {
 public:
  static uint64_t bytes_for(uint64_t capacity) { return ring_bytes(capacity); }
  // Lays out an empty ring of `capacity` slots (a power of two >= 2) at the start of `memory`,
  // before the memory is shared. Throws proxyep::Error when capacity or memory do not fit.
  static Ring create(std::span<std::byte> memory, uint64_t capacity);
  // Uses a ring another party created: checks magic, layout and descriptor versions and sizes.
  static Ring attach(std::span<std::byte> memory);

  uint64_t capacity() const { return capacity_; }
  RingHeader& header() const { return *header_; }
  WireDescriptor& slot(uint64_t position) const { return slots_[position & mask_]; }

 private:
  Ring(RingHeader* header, uint64_t capacity);
  RingHeader* header_;
  WireDescriptor* slots_;
  uint64_t capacity_;
  uint64_t mask_;
};

struct ProducerOptions {
  // Kicked when a publish finds the consumer asleep (the empty-to-non-empty edge). Optional.
  const Doorbell* doorbell = nullptr;
  // How long a producer that reserved past the end of a full ring waits for its slot before it
  // concludes the consumer is stuck (Status::timeout) and owes the position a nop.
  std::chrono::milliseconds stall_timeout{1000};
};

// One per producer thread (not thread-safe itself: it caches the tail).
class RingProducer {
 public:
  explicit RingProducer(Ring ring, ProducerOptions options = {});
  ~RingProducer();
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  // ok: published. again: full (or an owed nop's slot is still taken); nothing reserved.
  // timeout: the overshoot wait outlived stall_timeout; `d` was not published.
  Status try_push(const Descriptor& d) noexcept;
  // Pushes a prefix of `descriptors`, as long as the ring has room for, at consecutive
  // positions with one reservation (one atomic for the burst instead of one per descriptor).
  // ok: `pushed` >= 1 published. again: full, nothing reserved. timeout: an overshoot wait
  // outlived stall_timeout; the first `pushed` were published, the rest were not.
  Status try_push_burst(std::span<const Descriptor> descriptors, size_t& pushed) noexcept;
  // Waits for room until `deadline`. ok, or timeout (`d` not published).
  Status push(const Descriptor& d, const Deadline& deadline) noexcept;
  // Publishes owed nops, waiting until `deadline`. ok when nothing is owed any more.
  Status flush(const Deadline& deadline) noexcept;
  bool owes_nop() const noexcept { return owed_begin_ != owed_end_; }

 private:
  bool slot_free(uint64_t position) noexcept;
  Status wait_slot(uint64_t position, const Deadline& deadline) noexcept;
  // Writes the slot and publishes its seq; notify() afterwards tells a sleeping consumer.
  void write_slot(uint64_t position, const Descriptor& d) noexcept;
  void notify() noexcept;
  uint64_t reserve(uint64_t count) noexcept;
  uint64_t room(uint64_t wanted) noexcept;
  bool settle_owed() noexcept;
  void kick() noexcept;

  Ring ring_;
  const Doorbell* doorbell_;
  std::chrono::milliseconds stall_timeout_;
  uint64_t cached_tail_ = 0;
  // Positions [owed_begin_, owed_end_) were reserved by calls that timed out: each gets a nop.
  uint64_t owed_begin_ = 0;
  uint64_t owed_end_ = 0;
};

// The ring's single consumer (a proxy thread).
class RingConsumer {
 public:
  // Claims the consumer role; throws proxyep::Error if another RingConsumer holds it.
  explicit RingConsumer(Ring ring);
  ~RingConsumer();
  RingConsumer(const RingConsumer&) = delete;
  RingConsumer& operator=(const RingConsumer&) = delete;

  // Copies up to out.size() contiguous published slots out (seq included, for decode()) and
  // frees them. Returns how many; 0 when the next slot is not published yet.
  size_t pop_burst(std::span<WireDescriptor> out) noexcept;
  // The next slot is published.
  bool ready() const noexcept;
  uint64_t position() const noexcept { return position_; }
  // ok, or peer_failed when a producer died owing a reserved position.
  Status health() const noexcept;

  // Doorbell protocol (RingWaiter): announce_sleep() returns true when the ring was empty with
  // nothing reserved after the announcement, so the caller may block on the doorbell; false (the
  // announcement withdrawn) when a descriptor is published or about to be. end_sleep() after
  // waking.
  bool announce_sleep() noexcept;
  void end_sleep() noexcept;

 private:
  Ring ring_;
  uint64_t position_ = 0;
};

// ---- hot paths, inline ----

inline bool RingProducer::slot_free(uint64_t position) noexcept {
  const auto capacity = static_cast<int64_t>(ring_.capacity());
  // Signed: the cached tail may be ahead of a stale head snapshot.
  if (static_cast<int64_t>(position - cached_tail_) < capacity) return true;
  // acquire: pairs with the consumer's release store of tail in pop_burst(): its copies of the
  // slots below tail happen before we rewrite them.
  cached_tail_ = atomic(ring_.header().consumer.tail).load(std::memory_order_acquire);
  return static_cast<int64_t>(position - cached_tail_) < capacity;
}

inline uint64_t RingProducer::reserve(uint64_t count) noexcept {
  // seq_cst: takes positions [p, p + count); also the producer half of the doorbell's Dekker
  // pair with the consumer's seq_cst store of consumer_sleeping and load of head in
  // announce_sleep().
  return atomic(ring_.header().producer.head).fetch_add(count, std::memory_order_seq_cst);
}

// Free slots as far as this producer can tell, up to `wanted`, without reserving (0: full).
// Reads the consumer's tail only when the cached copy shows fewer than `wanted`.
inline uint64_t RingProducer::room(uint64_t wanted) noexcept {
  // relaxed: a snapshot for the room check only; the fetch-add in reserve() is what reserves.
  const uint64_t head = atomic(ring_.header().producer.head).load(std::memory_order_relaxed);
  const auto capacity = static_cast<int64_t>(ring_.capacity());
  // Signed: the cached tail may be ahead of a stale head snapshot.
  auto free = capacity - static_cast<int64_t>(head - cached_tail_);
  if (free < static_cast<int64_t>(wanted)) {
    // acquire: pairs with the consumer's release store of tail in pop_burst(), as in
    // slot_free().
    cached_tail_ = atomic(ring_.header().consumer.tail).load(std::memory_order_acquire);
    free = capacity - static_cast<int64_t>(head - cached_tail_);
  }
  return static_cast<uint64_t>(std::clamp<int64_t>(free, 0, static_cast<int64_t>(wanted)));
}

inline void RingProducer::write_slot(uint64_t position, const Descriptor& d) noexcept {
  const WireDescriptor image = encode(d, position + 1);
  WireDescriptor& slot = ring_.slot(position);
  // Plain stores of bytes 8..63: no consumer reads them before the release store of seq below,
  // and slot_free() proved the consumer's last copy of this slot happened before.
  std::memcpy(reinterpret_cast<char*>(&slot) + sizeof(slot.seq),
              reinterpret_cast<const char*>(&image) + sizeof(image.seq),
              sizeof(image) - sizeof(image.seq));
  // release: pairs with the consumer's acquire load of seq in pop_burst() and ready(): once it
  // reads p + 1 it reads the payload above.
  atomic(slot.seq).store(position + 1, std::memory_order_release);
}

inline void RingProducer::notify() noexcept {
  // seq_cst: the producer's load of the doorbell's Dekker pair; see reserve(). Cheap (a plain
  // load on x86) and the line is read-mostly, so it costs nothing when the consumer is awake.
  if (doorbell_ != nullptr &&
      atomic(ring_.header().signal.consumer_sleeping).load(std::memory_order_seq_cst) != 0)
    kick();
}

inline Status RingProducer::try_push(const Descriptor& d) noexcept {
  if (owes_nop() && !settle_owed()) return Status::again;
  if (room(1) == 0) return Status::again;
  const uint64_t position = reserve(1);
  if (!slot_free(position)) {  // overshoot, see the design block
    Status status = wait_slot(position, Deadline(stall_timeout_));
    if (status != Status::ok) {
      owed_begin_ = position;
      owed_end_ = position + 1;
      return status;
    }
  }
  write_slot(position, d);
  notify();
  return Status::ok;
}

inline size_t RingConsumer::pop_burst(std::span<WireDescriptor> out) noexcept {
  uint64_t position = position_;
  size_t count = 0;
  while (count < out.size()) {
    WireDescriptor& slot = ring_.slot(position);
    // acquire: pairs with the producer's release store of seq in RingProducer::write_slot() (or the
    // GPU's system-scope release in cuda/ring_producer.cuh): the payload is complete.
    const uint64_t seq = atomic(slot.seq).load(std::memory_order_acquire);
    if (seq != position + 1) break;
    WireDescriptor& copy = out[count];
    std::memcpy(reinterpret_cast<char*>(&copy) + sizeof(copy.seq),
                reinterpret_cast<const char*>(&slot) + sizeof(slot.seq),
                sizeof(slot) - sizeof(slot.seq));
    copy.seq = seq;
    ++position;
    ++count;
  }
  if (count != 0) {
    position_ = position;
    // release: pairs with the producers' acquire load of tail in slot_free(): the copies above
    // happen before any producer rewrites these slots on the next lap.
    atomic(ring_.header().consumer.tail).store(position, std::memory_order_release);
  }
  return count;
}

inline bool RingConsumer::ready() const noexcept {
  // acquire: pairs with the producer's release store of seq in write_slot() (see pop_burst()).
  return atomic(ring_.slot(position_).seq).load(std::memory_order_acquire) == position_ + 1;
}

}  // namespace proxyep::gpu_side
