#include "gpu_side/ring.hpp"

#include "gpu_side/doorbell.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace proxyep::gpu_side {
namespace {

constexpr const char* kPhase = "gpu_side.ring";

void check_placement(std::span<std::byte> memory) {
  require(reinterpret_cast<uintptr_t>(memory.data()) % kFalseSharingRange == 0, kPhase,
          "ring memory at {} is not {}-byte aligned", static_cast<void*>(memory.data()),
          kFalseSharingRange);
  require(memory.size() >= kRingSlotsOffset, kPhase,
          "ring memory of {} bytes cannot hold the {}-byte header", memory.size(),
          kRingSlotsOffset);
}

// Registers this process as a target of membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), once: a
// single producer relies on the consumer's barrier only once that holds (kSyncBarrier). False
// where the kernel lacks the command or a seccomp filter refuses it; then it fences instead.
bool register_for_consumer_barrier() noexcept {
  static const bool registered =
      ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  return registered;
}

// The consumer's half of the asymmetric Dekker pair (design block in ring.hpp): every running
// thread of every registered process passes a full memory barrier before this returns.
bool consumer_barrier() noexcept {
  return ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

}  // namespace

Ring::Ring(RingHeader* header, uint64_t capacity, ProducerMode mode)
    : header_(header),
      slots_(ring_slots(header)),
      capacity_(capacity),
      mask_(capacity - 1),
      mode_(mode) {}

Ring Ring::create(std::span<std::byte> memory, uint64_t capacity, ProducerMode mode) {
  check_placement(memory);
  require(is_power_of_two(capacity) && capacity >= 2, kPhase,
          "capacity {} must be a power of two >= 2 (positions are masked, not divided)", capacity);
  require(capacity <= (uint64_t{1} << 40), kPhase, "capacity {} is absurdly large", capacity);
  require(mode == ProducerMode::multi || mode == ProducerMode::single, kPhase,
          "unknown producer mode {}", static_cast<uint32_t>(mode));
  require(memory.size() >= ring_bytes(capacity), kPhase,
          "a ring of {} slots needs {} bytes, the memory has {}", capacity, ring_bytes(capacity),
          memory.size());
  // Zero header and slots: head = tail = 0 and every seq = 0, which matches no position's
  // "published" value (position + 1 >= 1), so no slot looks ready before its producer writes it.
  std::memset(memory.data(), 0, ring_bytes(capacity));
  auto* header = reinterpret_cast<RingHeader*>(memory.data());
  header->config.magic = kRingMagic;
  header->config.layout_version = kRingLayoutVersion;
  header->config.descriptor_version = kDescriptorVersion;
  header->config.slot_bytes = sizeof(WireDescriptor);
  header->config.capacity = capacity;
  header->config.slots_offset = kRingSlotsOffset;
  header->config.total_bytes = ring_bytes(capacity);
  header->config.producer_mode = mode;
  return Ring(header, capacity, mode);
}

Ring Ring::attach(std::span<std::byte> memory) {
  check_placement(memory);
  const auto* header = reinterpret_cast<RingHeader*>(memory.data());
  const RingConfig& config = header->config;
  require(config.magic == kRingMagic, kPhase,
          "no ring here (magic {:#x}, expected {:#x}): memory not initialised by Ring::create",
          config.magic, kRingMagic);
  require(config.layout_version == kRingLayoutVersion &&
              config.descriptor_version == kDescriptorVersion,
          kPhase,
          "ring made by another ProxyEP build: layout v{} / descriptor v{}, this build speaks "
          "layout v{} / descriptor v{}",
          config.layout_version, config.descriptor_version, kRingLayoutVersion, kDescriptorVersion);
  require(config.slot_bytes == sizeof(WireDescriptor) && config.slots_offset == kRingSlotsOffset &&
              is_power_of_two(config.capacity) && config.total_bytes == ring_bytes(config.capacity),
          kPhase, "corrupt ring header (slot {} B, slots at {}, capacity {}, {} bytes)",
          config.slot_bytes, config.slots_offset, config.capacity, config.total_bytes);
  require(memory.size() >= config.total_bytes, kPhase,
          "ring of {} slots needs {} bytes but only {} are mapped", config.capacity,
          config.total_bytes, memory.size());
  require(
      config.producer_mode == ProducerMode::multi || config.producer_mode == ProducerMode::single,
      kPhase, "corrupt ring header (producer mode {})",
      static_cast<uint32_t>(config.producer_mode));
  return Ring(const_cast<RingHeader*>(header), config.capacity, config.producer_mode);
}

// ---- producer ----

RingProducer::RingProducer(Ring ring, ProducerOptions options)
    : ring_(ring),
      doorbell_(options.doorbell),
      stall_timeout_(options.stall_timeout),
      single_(ring.producer_mode() == ProducerMode::single) {
  if (!single_) return;
  ProducerState& state = ring_.header().producer;
  uint32_t expected = 0;
  // acq_rel: pairs with the release store of 0 in the previous single producer's destructor, so
  // its last head store (and its slots) are visible and this producer continues after them.
  require(atomic(state.attached).compare_exchange_strong(expected, 1, std::memory_order_acq_rel),
          kPhase,
          "the ring is single-producer and already has a producer (create it with "
          "ProducerMode::multi for several)");
  // acquire: pairs with the previous single producer's release store of head in publish_head().
  head_ = atomic(state.head).load(std::memory_order_acquire);
  // acquire: pairs with the consumer's release store of tail in pop_burst(), as in slot_free().
  cached_tail_ = atomic(ring_.header().consumer.tail).load(std::memory_order_acquire);
  fence_ = options.fence_per_publish || !register_for_consumer_barrier();
  // seq_cst exchange, then seq_cst load of the flag: pairs with the consumer's seq_cst store of
  // consumer_sleeping and seq_cst load of sync in announce_sleep(). A consumer that read the old
  // mode (and so skipped membarrier()) did so before this exchange in the single total order, and
  // its flag store before that; so the load below reads that flag store or a later value, and so
  // does every later (relaxed) flag load of this producer, by read-read coherence.
  atomic(state.sync).exchange(fence_ ? kSyncFence : kSyncBarrier, std::memory_order_seq_cst);
  (void)atomic(ring_.header().signal.consumer_sleeping).load(std::memory_order_seq_cst);
}

RingProducer::~RingProducer() {
  if (single_) {
    // release: pairs with the next single producer's acq_rel claim in the constructor. A single
    // producer never owes a nop (it reserves nothing it does not publish at once).
    atomic(ring_.header().producer.attached).store(0, std::memory_order_release);
    return;
  }
  if (!owes_nop()) return;
  if (flush(Deadline(stall_timeout_)) == Status::ok) return;
  // release: pairs with the consumer's acquire load of abandoned in health(): the consumer will
  // stall at this position forever, so it must learn why.
  atomic(ring_.header().signal.abandoned).store(owed_begin_ + 1, std::memory_order_release);
}

Status RingProducer::wait_slot(uint64_t position, const Deadline& deadline) noexcept {
  Backoff backoff;
  for (uint32_t i = 0;; ++i) {
    if (slot_free(position)) return Status::ok;
    // Reading the clock costs as much as a slot check: look at it every 64 rounds.
    if (i % 64 == 63 && deadline.expired()) return Status::timeout;
    backoff.pause();
  }
}

bool RingProducer::settle_owed() noexcept {
  const uint64_t before = owed_begin_;
  while (owed_begin_ != owed_end_ && slot_free(owed_begin_))
    write_slot(owed_begin_++, Descriptor{.op = Op::nop});
  if (owed_begin_ != before) notify();
  return !owes_nop();
}

Status RingProducer::try_push_burst(std::span<const Descriptor> descriptors,
                                    size_t& pushed) noexcept {
  pushed = 0;
  if (descriptors.empty()) return Status::ok;
  if (single_) {
    const uint64_t count = room(head_, descriptors.size());
    if (count == 0) return Status::again;
    for (; pushed < count; ++pushed)
      write_slot(head_ + pushed, descriptors[pushed]);
    publish_head(head_ + count);  // one head store and one doorbell check per burst
    return Status::ok;
  }
  if (owes_nop() && !settle_owed()) return Status::again;
  // relaxed: a snapshot for the room check only; the fetch-add in reserve() is what reserves.
  const uint64_t count = room(atomic(ring_.header().producer.head).load(std::memory_order_relaxed),
                              descriptors.size());
  if (count == 0) return Status::again;
  const uint64_t first = reserve(count);
  Status status = Status::ok;
  for (; pushed < count; ++pushed) {
    const uint64_t position = first + pushed;
    // Overshoot (see the design block) can leave the tail of the burst past the ring's end.
    if (!slot_free(position)) {
      status = wait_slot(position, Deadline(stall_timeout_));
      if (status != Status::ok) {
        owed_begin_ = position;
        owed_end_ = first + count;
        break;
      }
    }
    write_slot(position, descriptors[pushed]);
  }
  if (pushed != 0) notify();
  return status;
}

Status RingProducer::push(const Descriptor& d, const Deadline& deadline) noexcept {
  if (single_) {
    // Nothing to take turns with: wait for room first, reserve nothing.
    Status status = wait_slot(head_, deadline);
    if (status != Status::ok) return status;
    write_slot(head_, d);
    publish_head(head_ + 1);
    return Status::ok;
  }
  if (owes_nop()) {
    Status status = flush(deadline);
    if (status != Status::ok) return status;
  }
  // Ticket order: reserve first, then wait for the slot (see the design block).
  const uint64_t position = reserve(1);
  Status status = wait_slot(position, deadline);
  if (status != Status::ok) {
    owed_begin_ = position;
    owed_end_ = position + 1;
    return status;
  }
  write_slot(position, d);
  notify();
  return Status::ok;
}

Status RingProducer::flush(const Deadline& deadline) noexcept {
  Status status = Status::ok;
  const uint64_t before = owed_begin_;
  while (owes_nop()) {
    status = wait_slot(owed_begin_, deadline);
    if (status != Status::ok) break;
    write_slot(owed_begin_++, Descriptor{.op = Op::nop});
  }
  if (owed_begin_ != before) notify();
  return status;
}

void RingProducer::kick() noexcept {
  // acq_rel exchange: of all producers that saw the flag, exactly one takes it from 1 to 0 and
  // writes the eventfd; pairs with the consumer's seq_cst store of 1 in announce_sleep().
  if (atomic(ring_.header().signal.consumer_sleeping).exchange(0, std::memory_order_acq_rel) != 0)
    doorbell_->kick();
}

void RingProducer::set_waiting(bool waiting) noexcept {
  atomic(ring_.header().producer.waiting).exchange(waiting ? 1 : 0, std::memory_order_seq_cst);
  if (waiting && doorbell_ != nullptr &&
      atomic(ring_.header().signal.consumer_sleeping).load(std::memory_order_seq_cst) != 0)
    kick();
}

// ---- consumer ----

RingConsumer::RingConsumer(Ring ring) : ring_(ring) {
  uint32_t expected = 0;
  // acq_rel: pairs with the release store of 0 in the previous consumer's destructor, so its
  // last tail store is visible and this consumer resumes exactly where it stopped.
  require(atomic(ring_.header().consumer.attached)
              .compare_exchange_strong(expected, 1, std::memory_order_acq_rel),
          kPhase, "the ring already has a consumer (rings are single-consumer)");
  // acquire: pairs with the previous consumer's release store of tail in pop_burst().
  position_ = atomic(ring_.header().consumer.tail).load(std::memory_order_acquire);
}

RingConsumer::~RingConsumer() {
  // release: pairs with the next consumer's acq_rel claim in the constructor.
  atomic(ring_.header().consumer.attached).store(0, std::memory_order_release);
}

Status RingConsumer::health() const noexcept {
  // acquire: pairs with the release store in ~RingProducer() of a producer that gave up.
  if (atomic(ring_.header().signal.abandoned).load(std::memory_order_acquire) != 0)
    return Status::peer_failed;
  return Status::ok;
}

bool RingConsumer::announce_sleep() noexcept {
  RingHeader& header = ring_.header();
  // seq_cst store then seq_cst load of head: the consumer half of the doorbell's Dekker pair,
  // against the producers' seq_cst fetch-add of head (reserve()) followed by their seq_cst load
  // of consumer_sleeping (notify()), or the single producer's head store, fence and flag load
  // (publish_head()). If this load misses a reservation, that producer's load comes later in the
  // single total order and sees the flag.
  atomic(header.signal.consumer_sleeping).store(1, std::memory_order_seq_cst);
  // seq_cst: pairs with the single producer's seq_cst store of sync and fence in its
  // constructor (see there). kSyncBarrier: that producer has no fence between its head store and
  // its flag load; membarrier() supplies it, between our flag store and our head load. If the
  // syscall fails, stay awake rather than risk a lost wake-up.
  if (ring_.producer_mode() == ProducerMode::single &&
      atomic(header.producer.sync).load(std::memory_order_seq_cst) == kSyncBarrier &&
      !consumer_barrier()) {
    end_sleep();
    return false;
  }
  // seq_cst: pairs with the exchange in RingProducer::set_waiting (its flag load comes after).
  if (atomic(header.producer.head).load(std::memory_order_seq_cst) == position_ &&
      atomic(header.producer.waiting).load(std::memory_order_seq_cst) == 0)
    return true;
  end_sleep();  // something is reserved or published, or the producer waits: stay awake
  return false;
}

void RingConsumer::end_sleep() noexcept {
  // relaxed: the flag only decides whether producers kick; a late reset costs a spurious kick,
  // which the next wait absorbs. Slot data is ordered by seq, not by this word.
  atomic(ring_.header().signal.consumer_sleeping).store(0, std::memory_order_relaxed);
}

}  // namespace proxyep::gpu_side
