// Shared pieces of the gpu_side tests: a ring in its own memory, recognisable descriptors, and a
// checker that every descriptor arrives exactly once, intact, in each producer's order.
#pragma once

#include "common/deadline.hpp"
#include "common/host_memory.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::testing {

struct HeapRing {
  explicit HeapRing(uint64_t capacity, ProducerMode mode = ProducerMode::multi)
      : memory(HostMemory::heap(Ring::bytes_for(capacity))),
        ring(Ring::create(memory.bytes(), capacity, mode)) {}
  HostMemory memory;
  Ring ring;
};

// Descriptor `index` of producer `producer`: every field derived from both, offsets past 4 GiB,
// ranks past 1023, and a cookie that names it.
inline Descriptor make_descriptor(uint32_t producer, uint64_t index) {
  Descriptor d;
  d.op = index % 5 == 4 ? Op::signal : Op::write_imm;
  d.flags = (index & 1) != 0 ? kFlagMore : uint16_t{0};
  d.dst_rank = 1000 + producer * 7 + static_cast<uint32_t>(index % 100);
  d.local_region = producer;
  d.remote_region = static_cast<uint32_t>(index * 3);
  d.src_offset = (uint64_t{6} << 30) + index * 4096;
  d.dst_offset = (uint64_t{9} << 32) + index * 8192 + producer;
  d.length = d.op == Op::signal ? 0 : 1 + index % 65536;
  d.cookie = (uint64_t{producer} << 40) | index;
  d.imm = static_cast<uint32_t>(index * 2654435761u) ^ producer;
  return d;
}

inline bool same(const Descriptor& a, const Descriptor& b) {
  return a.op == b.op && a.flags == b.flags && a.dst_rank == b.dst_rank &&
         a.local_region == b.local_region && a.remote_region == b.remote_region &&
         a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length &&
         a.cookie == b.cookie && a.imm == b.imm;
}

// Checks popped slots: each decodes, is the next one of its producer, and equals what that
// producer pushed. Nops (owed positions) are counted apart. Counts failures instead of asserting
// per descriptor so a million checks stay fast; the test asserts the totals (check_intact()).
// A slot that does not decode is corrupt: the consumer copied it before its payload was complete
// (a torn slot: the sequence word was visible first) or from an earlier lap. Every popped slot is
// consumed for good, so a wait for `n` descriptors ends once `n` slots were popped, whatever they
// held: a torn slot fails the test at once instead of leaving it waiting for its deadline.
class ArrivalChecker {
 public:
  explicit ArrivalChecker(uint32_t producers) : next_(producers, 0) {}

  void check(std::span<const WireDescriptor> slots) {
    for (const WireDescriptor& slot : slots) {
      Descriptor d;
      if (decode(slot, d) != DecodeResult::ok) {
        ++corrupt_;
        continue;
      }
      if (d.op == Op::nop) {
        ++nops_;
        continue;
      }
      const auto producer = static_cast<uint32_t>(d.cookie >> 40);
      const uint64_t index = d.cookie & ((uint64_t{1} << 40) - 1);
      if (producer >= next_.size() || index != next_[producer] ||
          !same(d, make_descriptor(producer, index))) {
        ++wrong_;
        // After a gap (a corrupt slot, a lost one), count on from here: one fault, not all later.
        if (producer < next_.size() && index > next_[producer] &&
            same(d, make_descriptor(producer, index)))
          next_[producer] = index + 1;
        continue;
      }
      ++next_[producer];
      ++received_;
    }
  }

  uint64_t received() const { return received_; }
  uint64_t corrupt() const { return corrupt_; }
  uint64_t wrong() const { return wrong_; }
  uint64_t nops() const { return nops_; }
  uint64_t popped() const { return received_ + corrupt_ + wrong_ + nops_; }
  std::string summary() const {
    return fmt::format(
        "{} slots popped: {} intact, {} corrupt (did not decode: read before the payload was "
        "complete, or a stale lap), {} wrong (out of order or altered), {} nops",
        popped(), received_, corrupt_, wrong_, nops_);
  }
  uint64_t next(uint32_t producer) const { return next_[producer]; }

 private:
  std::vector<uint64_t> next_;
  uint64_t received_ = 0, corrupt_ = 0, wrong_ = 0, nops_ = 0;
};

// The totals of a run that pushed `expected` descriptors (and no nops), with a message that
// counts the corrupt and wrong slots.
inline void check_intact(const ArrivalChecker& checker, uint64_t expected) {
  CHECK_MESSAGE(checker.corrupt() == 0, checker.summary());
  CHECK_MESSAGE(checker.wrong() == 0, checker.summary());
  CHECK_MESSAGE(checker.received() == expected, checker.summary());
}

// Pops into `checker` until `total` slots were popped (see ArrivalChecker) or `deadline` passes;
// false on timeout.
inline bool drain(RingConsumer& consumer, ArrivalChecker& checker, uint64_t total,
                  const Deadline& deadline, size_t burst = 32) {
  std::vector<WireDescriptor> buffer(burst);
  uint32_t idle = 0;
  while (checker.popped() < total) {
    size_t n = consumer.pop_burst(buffer);
    if (n != 0) {
      checker.check(std::span(buffer).first(n));
      idle = 0;
      continue;
    }
    if (++idle % 256 == 0 && deadline.expired()) return false;
    std::this_thread::yield();
  }
  return true;
}

// Writes descriptor `d` into slot `position` the slow way: one field at a time, yielding between
// fields, seq last (release). A consumer that acted on anything but seq == position + 1 would
// copy a mixture of two laps.
inline void write_slot_slowly(const Ring& ring, uint64_t position, const Descriptor& d) {
  const WireDescriptor image = encode(d, position + 1);
  WireDescriptor& slot = ring.slot(position);
  auto step = [] { std::this_thread::yield(); };
  slot.version = image.version, step();
  slot.op = image.op, step();
  slot.flags = image.flags, step();
  slot.dst_rank = image.dst_rank, step();
  slot.local_region = image.local_region, step();
  slot.remote_region = image.remote_region, step();
  slot.src_offset = image.src_offset, step();
  slot.dst_offset = image.dst_offset, step();
  slot.length = image.length, step();
  slot.cookie = image.cookie, step();
  slot.imm = image.imm, step();
  slot.check = image.check, step();
  atomic(slot.seq).store(position + 1, std::memory_order_release);
}

// Consumes through `waiter` into `checker` until `count` slots were popped or 15 s passed.
inline void drain(RingWaiter& waiter, RingConsumer& consumer, ArrivalChecker& checker,
                  uint64_t count) {
  std::vector<WireDescriptor> out(32);
  const Deadline deadline(std::chrono::seconds(15));
  while (checker.popped() < count) {
    if (waiter.wait(deadline) != Status::ok) break;
    checker.check(std::span(out).first(consumer.pop_burst(out)));
  }
}

// Reaps a forked child within 10 s (SIGKILL after that); returns its wait status.
inline int reap_child(pid_t child) {
  int status = -1;
  const Deadline reap(std::chrono::seconds(10));
  while (::waitpid(child, &status, WNOHANG) == 0 && !reap.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (reap.expired()) ::kill(child, SIGKILL), ::waitpid(child, &status, 0);
  return status;
}

}  // namespace proxyep::gpu_side::testing
