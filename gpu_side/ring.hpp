// Descriptor ring: one consumer and either many producers (the default) or exactly one, in
// memory that every party maps (ring_layout.hpp: a 512-byte header, then `capacity` 64-byte
// slots; common/host_memory.hpp: heap or memfd memory, pinned_memory.hpp: CUDA mapped pinned).
//
// Shape (DPDK rte_ring): free-running 64-bit positions masked on access (2^64 descriptors at
// 1e9/s take 584 years to wrap), capacity a power of two, producer and consumer state 128 bytes
// apart. The memory holds offsets only, never pointers. Ring::create fixes the producer mode
// (ProducerMode, in the header); every RingProducer follows the mode it finds there.
//
// Multi-producer rings (ProducerMode::multi): any number of threads, in this process or another
// one mapping the same memfd. (Or the threads of one GPU, cuda/ring_producer.cuh — never mixed
// with host producers on one ring: GPU atomics on mapped host memory are not atomic with respect
// to the CPU.) Each thread owns a RingProducer handle that caches the consumer's tail.
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
// Single-producer rings (ProducerMode::single): one RingProducer at a time, claimed in the
//   header like the consumer role (a second one throws proxyep::Error); it may live in another
//   process. It keeps head in a private variable: it checks for room as above, writes the slot
//   and its seq exactly as in step 3, then stores head = p + 1 with release. No atomic
//   read-modify-write anywhere on the push path, no overshoot, no owed nops: a push that finds no
//   room (or times out) has taken nothing. The shared head still says how many are published
//   (quiet waiters read it, proxy/engine/ring_lane.hpp) and is the producer's half of the doorbell.
// Consumer: exactly one RingConsumer at a time (claimed in the header). At position c it acts on
//   a slot only once seq == c + 1 (acquire): a half-written slot, or one from an earlier lap,
//   never matches. pop_burst copies up to N contiguous ready slots out and then publishes
//   tail = c + n, which frees them all for the next lap. A slot is free as soon as it is copied:
//   network flow control lives in the proxy, not here. The consumer does the same in both modes.
//
// Why slots are freed by the tail rather than per slot (the Vyukov queue's seq = c + capacity):
// one tail store per burst instead of one store per slot saves the consumer a write and the
// producer a coherence miss per descriptor, and it is the only scheme a GPU can afford (it checks
// a cached tail instead of reading every slot's seq across PCIe). seq still marks which lap a
// slot holds, and the check word covers seq, so a stale slot never decodes.
//
// Cost: a multi-producer push's fetch-add is a locked instruction, which waits until the
// producer's earlier stores (the previous slot) have left its store buffer. When the consumer
// keeps up, it reads each slot right after its publication, so those stores often wait for the
// line to come back from the consumer's cache: one cross-core transfer (~100 ns on a 2-vCPU VM)
// per push. A burst push pays it once per burst; a consumer that pauses after an empty poll lets
// a batch accumulate. (Prefetching slots for writing a few positions ahead made no measurable
// difference here, so the producer does not.) The single producer issues only plain stores, so
// its slot stores drain from the store buffer while it already encodes the next descriptors, as
// long as nothing makes it wait for them: write_slot() therefore never reloads what it (or its
// caller) just stored with a wider load, which store forwarding cannot serve.
//
// The doorbell (doorbell.hpp) needs a store-load (Dekker) pair: the producer stores its head and
// then loads consumer_sleeping; the consumer stores consumer_sleeping and then loads head. On
// x86 both "store then load" need a full fence (or a locked instruction) to stay in that order,
// which is the very cost the single-producer mode removes. And the producer cannot confine the
// fence to the empty-to-non-empty edge: when the consumer keeps up the ring is empty before
// nearly every push, and "empty" is itself only known through a load that the same store-load
// reordering makes stale. So the fence moves to the side that is about to sleep anyway
// (asymmetric Dekker, as liburcu and folly do): the single producer's process registers for
// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) and keeps only a compiler barrier between its head
// store and its flag load; the consumer, between its flag store and its head load, calls
// membarrier(), which makes every running thread of every registered process pass a full
// barrier. Either the producer's barrier point falls after its head store (the consumer's head
// load, after the syscall, sees it) or before its flag load (which then sees the flag, stored
// before the syscall). A thread that is not running has passed a barrier at its context switch.
// The syscall (~0.2-2 us) sits on the consumer's way to blocking in ppoll, never on a push.
// Where membarrier is missing (old kernel, seccomp) or ProducerOptions::fence_per_publish is set,
// the producer records kSyncFence in the header and pays a locked exchange of head per publish
// (per burst for try_push_burst) instead; the consumer reads the mode after its flag store, so a
// producer that attaches while the consumer sleeps is covered too (see RingProducer's constructor).
//
// Memory orders; each use names its partner:
//   producer seq.store(p + 1, release)  -> consumer seq.load(acquire): the payload is visible.
//   consumer tail.store(c, release)     -> producer tail.load(acquire): the consumer's copies of
//                                          slots below c happen before a producer rewrites them.
//   multi: producer head.fetch_add(seq_cst), then consumer_sleeping.load(seq_cst)  <->
//          consumer consumer_sleeping.store(1, seq_cst), then head.load(seq_cst):
//       the doorbell's Dekker pair (store-load on both sides; see doorbell.hpp). Either the
//       consumer sees the reservation and stays awake, or the producer sees it sleeping.
//   single, kSyncBarrier: producer head.store(p + 1, release), compiler barrier, then
//          consumer_sleeping.load(relaxed)  <->  consumer consumer_sleeping.store(1, seq_cst),
//          sync.load(seq_cst), membarrier(), then head.load(seq_cst): the same pair, with the
//          producer's fence supplied by the consumer's membarrier().
//   single, kSyncFence: producer head.exchange(p + 1, seq_cst), then
//          consumer_sleeping.load(seq_cst)  <->  the consumer as above, without membarrier().
//   single: producer head.store(p + 1, release) -> a quiet waiter's head.load(acquire)
//          (RingLane::reserved()), and -> the next single producer's head.load(acquire) when it
//          attaches, after the claim.
#pragma once

#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/ring_layout.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
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

// A view of a ring laid out in memory someone else owns (common/host_memory.hpp); cheap to copy.
class Ring {
 public:
  static uint64_t bytes_for(uint64_t capacity) { return ring_bytes(capacity); }
  // Lays out an empty ring of `capacity` slots (a power of two >= 2) at the start of `memory`,
  // before the memory is shared. Throws proxyep::Error when capacity or memory do not fit.
  // `mode` single: one RingProducer at a time and no atomic read-modify-write per push (see the
  // design block); GPU producers (cuda/ring_producer.cuh) need the default, multi.
  static Ring create(std::span<std::byte> memory, uint64_t capacity,
                     ProducerMode mode = ProducerMode::multi);
  // Uses a ring another party created: checks magic, layout and descriptor versions and sizes.
  static Ring attach(std::span<std::byte> memory);

  uint64_t capacity() const { return capacity_; }
  ProducerMode producer_mode() const { return mode_; }
  RingHeader& header() const { return *header_; }
  WireDescriptor& slot(uint64_t position) const { return slots_[position & mask_]; }

 private:
  Ring(RingHeader* header, uint64_t capacity, ProducerMode mode);
  RingHeader* header_;
  WireDescriptor* slots_;
  uint64_t capacity_;
  uint64_t mask_;
  ProducerMode mode_;
};

struct ProducerOptions {
  // Kicked when a publish finds the consumer asleep (the empty-to-non-empty edge). Optional.
  const Doorbell* doorbell = nullptr;
  // How long a producer that reserved past the end of a full ring waits for its slot before it
  // concludes the consumer is stuck (Status::timeout) and owes the position a nop.
  std::chrono::milliseconds stall_timeout{1000};
  // Single-producer rings: order every publish before the doorbell check with a locked exchange
  // of head (kSyncFence), even where membarrier() would let the consumer supply the barrier
  // (tests of the fallback; compare figures). Ignored on multi-producer rings, whose fetch-add
  // already orders it, and without a doorbell, where nothing needs the order.
  bool fence_per_publish = false;
};

// One per producer thread (not thread-safe itself: it caches the tail). On a single-producer
// ring, the one producer of the ring.
class RingProducer {
 public:
  // On a single-producer ring, claims the producer role; throws proxyep::Error if another
  // RingProducer holds it.
  explicit RingProducer(Ring ring, ProducerOptions options = {});
  ~RingProducer();
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  // ok: published. again: full (or an owed nop's slot is still taken); nothing reserved.
  // timeout: the overshoot wait outlived stall_timeout; `d` was not published (multi only).
  Status try_push(const Descriptor& d) noexcept;
  // Pushes a prefix of `descriptors`, as long as the ring has room for, at consecutive
  // positions with one reservation (one atomic for the burst instead of one per descriptor).
  // ok: `pushed` >= 1 published. again: full, nothing reserved. timeout: an overshoot wait
  // outlived stall_timeout; the first `pushed` were published, the rest were not.
  Status try_push_burst(std::span<const Descriptor> descriptors, size_t& pushed) noexcept;
  // Waits for room until `deadline`. ok, or timeout (`d` not published; a multi-producer ring
  // then owes the reserved position a nop, a single-producer ring owes nothing).
  Status push(const Descriptor& d, const Deadline& deadline) noexcept;
  // Publishes owed nops, waiting until `deadline`. ok when nothing is owed any more.
  Status flush(const Deadline& deadline) noexcept;
  bool owes_nop() const noexcept { return owed_begin_ != owed_end_; }
  // The producer's process is (true) or is no longer (false) waiting on the consumer's effects
  // (ProducerState::waiting); starting to wait kicks a consumer that sleeps, so it polls again.
  // The store is a locked exchange (a full fence) and announce_sleep() loads the word after its
  // flag store: the Dekker pair of the doorbell, so a consumer never sleeps through a waiter.
  void set_waiting(bool waiting) noexcept;
  // Single-producer ring in kSyncFence: each publish pays a locked exchange (no membarrier, or
  // fence_per_publish). False on multi-producer rings.
  bool fences_publish() const noexcept { return single_ && fence_; }

 private:
  bool slot_free(uint64_t position) noexcept;
  Status wait_slot(uint64_t position, const Deadline& deadline) noexcept;
  // Writes the slot and publishes its seq; notify() afterwards tells a sleeping consumer.
  void write_slot(uint64_t position, const Descriptor& d) noexcept;
  void notify() noexcept;
  // Single-producer ring: publishes head = `head` and does the doorbell check.
  void publish_head(uint64_t head) noexcept;
  uint64_t reserve(uint64_t count) noexcept;
  uint64_t room(uint64_t head, uint64_t wanted) noexcept;
  bool settle_owed() noexcept;
  void kick() noexcept;

  Ring ring_;
  const Doorbell* doorbell_;
  std::chrono::milliseconds stall_timeout_;
  bool single_;        // the ring is single-producer and this producer holds it
  bool fence_ = true;  // single: kSyncFence, a locked exchange per publish; false: kSyncBarrier
  uint64_t head_ = 0;  // single: the next position; the shared head trails it until a publish
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

// Free slots past `head` as far as this producer can tell, up to `wanted`, without reserving
// (0: full). Reads the consumer's tail only when the cached copy shows fewer than `wanted`.
inline uint64_t RingProducer::room(uint64_t head, uint64_t wanted) noexcept {
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

// `value` forced into a register here, on its own. The empty asm claims to change it, so the
// compiler can neither merge neighbouring loads into one wider (vector) load nor spill the value
// to the stack and read it back with one: see write_slot() for why that matters.
template <typename T>
inline T in_register(T value) noexcept {
#if defined(__GNUC__)
  asm("" : "+r"(value));
#endif
  return value;
}

inline void RingProducer::write_slot(uint64_t position, const Descriptor& d) noexcept {
  // Store forwarding. `d` is usually a temporary the caller has just written field by field, and
  // the image encode() builds is another; their stores are still in the store buffer. A load
  // wider than the store it reads (GCC fetches src_offset and dst_offset with one 16-byte load,
  // and memcpy'd the image with 16-byte loads over its byte and word stores) cannot be forwarded:
  // it waits until those stores reach the cache, which is behind the previous slot's stores,
  // which wait for their line to come back from the consumer. Perf put 30% and then 75% of a
  // single-producer push on such loads. So: field-wide loads of `d`, and the image goes to the
  // slot as seven 8-byte words built in registers, never through memory.
  Descriptor fields;
  fields.op = in_register(d.op);
  fields.flags = in_register(d.flags);
  fields.dst_rank = in_register(d.dst_rank);
  fields.local_region = in_register(d.local_region);
  fields.remote_region = in_register(d.remote_region);
  fields.src_offset = in_register(d.src_offset);
  fields.dst_offset = in_register(d.dst_offset);
  fields.length = in_register(d.length);
  fields.cookie = in_register(d.cookie);
  fields.imm = in_register(d.imm);
  const WireDescriptor image = encode(fields, position + 1);
  static_assert(std::endian::native == std::endian::little,
                "the words below follow WireDescriptor's little-endian layout");
  const uint64_t words[7] = {uint64_t{image.version} | uint64_t{image.op} << 8 |
                                 uint64_t{image.flags} << 16 | uint64_t{image.dst_rank} << 32,
                             uint64_t{image.local_region} | uint64_t{image.remote_region} << 32,
                             image.src_offset,
                             image.dst_offset,
                             image.length,
                             image.cookie,
                             uint64_t{image.imm} | uint64_t{image.check} << 32};
  WireDescriptor& slot = ring_.slot(position);
  // Plain stores of bytes 8..63: no consumer reads them before the release store of seq below,
  // and slot_free() proved the consumer's last copy of this slot happened before.
  char* payload = reinterpret_cast<char*>(&slot) + sizeof(slot.seq);
  for (size_t i = 0; i < 7; ++i) {
    const uint64_t word = in_register(words[i]);
    std::memcpy(payload + i * sizeof(word), &word, sizeof(word));
  }
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

inline void RingProducer::publish_head(uint64_t head) noexcept {
  head_ = head;
  std::atomic_ref<uint64_t> shared_head = atomic(ring_.header().producer.head);
  std::atomic_ref<uint32_t> sleeping = atomic(ring_.header().signal.consumer_sleeping);
  if (doorbell_ != nullptr && fence_) {
    // kSyncFence. seq_cst exchange (a locked instruction: the store plus a full barrier) then
    // seq_cst load of the flag: the producer's half of the doorbell's Dekker pair with the
    // consumer's seq_cst store of consumer_sleeping and seq_cst load of head in
    // announce_sleep(). Also a release store of head for the partners named below.
    shared_head.exchange(head, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst) != 0) kick();
    return;
  }
  // release: pairs with the acquire load of head in RingLane::reserved() (every position below
  // it is published) and in the next single producer's constructor; and the producer's store of
  // the doorbell's Dekker pair with the consumer's seq_cst load of head in announce_sleep().
  shared_head.store(head, std::memory_order_release);
  if (doorbell_ == nullptr) return;
  // kSyncBarrier. A compiler barrier only: the head store and the flag load stay in this order
  // in the code, and the consumer's membarrier() in announce_sleep() makes the CPU keep them in
  // order with respect to it (see the design block): it pairs with this point.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  // relaxed: ordered after the head store by the membarrier() above (and, for a consumer that
  // skipped it, by the constructor's seq_cst exchange and load); the kick's exchange carries the
  // synchronization.
  if (sleeping.load(std::memory_order_relaxed) != 0) kick();
}

inline Status RingProducer::try_push(const Descriptor& d) noexcept {
  if (single_) {
    if (!slot_free(head_)) return Status::again;
    write_slot(head_, d);
    publish_head(head_ + 1);
    return Status::ok;
  }
  if (owes_nop() && !settle_owed()) return Status::again;
  // relaxed: a snapshot for the room check only; the fetch-add in reserve() is what reserves.
  if (room(atomic(ring_.header().producer.head).load(std::memory_order_relaxed), 1) == 0)
    return Status::again;
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
