// RingLane: one descriptor ring as the proxy thread that drains it sees it, with the cursors
// that make quiet() exact (NCCL's posted >= transmitted >= done, GIN's in-order retirement):
//
//   reserved (producers' head)  >=  popped (consumer position)  >=  retired (in-order prefix)
//
// - popped: descriptors copied out of the ring (their slots are already free again). Each gets
//   a control::QuietTracker ticket, ticket = position - base, so tickets follow ring order.
// - A popped descriptor stays unfinished until its write completes locally, or at once when it
//   needs no write (nop, refused, dropped for a failed peer). Completions come in any order; the
//   tracker's retired prefix advances over contiguous finished tickets only, so
//   "retired >= p" means every descriptor before ring position p is finished.
// - quiet() snapshots `reserved` and waits for `retired` to reach it: every descriptor a host
//   producer had reserved before the call has then completed, whether it was still in the ring,
//   in the backlog or on the wire.
// - The lane pops only while popped - retired < window, so the per-position entry table (and
//   the tracker's window, the same size) never wraps onto an unfinished descriptor.
//
// Threading: the owning proxy thread (or a waiter driving it, under its pass lock:
// proxy_thread.hpp) does everything except retired(), reserved(), popped_published() and
// outstanding(), which quiet waiters call from any thread:
// - retired(): the tracker's acquire load of its prefix (pairs with the proxy thread's seq_cst
//   CAS in PrefixWindow), so a waiter that sees a position retired sees its completion handled.
// - reserved(): acquire load of the ring's producer head (the producers' seq_cst fetch-add, or a
// single producer's release store);
//   only the count matters to a waiter.
#pragma once

#include "control/quiet_tracker.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace proxyep::proxy {

class RingLane {
 public:
  struct Entry {
    uint64_t position = ~uint64_t{0};
    uint64_t bytes = 0;
    int32_t dst = -1;
    bool live = false;      // a write is in flight for this position
    int64_t posted_ns = 0;  // when its write was posted (steady clock), for the latency histogram
  };

  // `window`: a power of two, the most descriptors of this ring unfinished at once.
  RingLane(gpu_side::Ring ring, const gpu_side::Doorbell* doorbell, uint32_t window)
      : consumer_(ring),
        ring_(ring),
        doorbell_(doorbell),
        tracker_(window),
        entries_(window),
        mask_(window - 1),
        base_(consumer_.position()) {}

  // Pops up to out.size() descriptors (fewer when the window is nearly full) and issues their
  // tickets. Returns how many; their positions are next_position() - count onwards.
  size_t pop(std::span<gpu_side::WireDescriptor> out) {
    uint64_t room = entries_.size() - unfinished();
    if (room < out.size()) out = out.first(static_cast<size_t>(room));
    size_t count = out.empty() ? 0 : consumer_.pop_burst(out);
    for (size_t i = 0; i < count; ++i) {
      control::QuietTracker::Ticket ticket;
      (void)tracker_.post(ticket);  // cannot be again: the window bounded the pop
    }
    return count;
  }
  uint64_t next_position() const { return consumer_.position(); }

  // Marks `position` (just popped) in flight with a write of `bytes` to `dst`, about to be
  // posted at `posted_ns` (a write that waits in the backlog is stamped again when it posts).
  void track(uint64_t position, int dst, uint64_t bytes, int64_t posted_ns) {
    entries_[position & mask_] = Entry{position, bytes, dst, true, posted_ns};
  }
  // The entry of a position in flight; null when there is none (a stray cookie).
  Entry* find(uint64_t position) {
    Entry& entry = entries_[position & mask_];
    return entry.live && entry.position == position ? &entry : nullptr;
  }
  // Calls f(position, entry) for every position with a write in flight.
  template <typename F>
  void for_each_live(F&& f) {
    for (Entry& entry : entries_)
      if (entry.live) f(entry.position, entry);
  }
  // `position` finished. Status::error (tracker's last_error()) if it was finished before.
  // The new retired prefix is published in the ring's header for producers in other processes.
  [[nodiscard]] Status finish(uint64_t position) {
    entries_[position & mask_].live = false;
    const Status status = tracker_.complete(position - base_);
    gpu_side::atomic(ring_.header().consumer.retired).store(retired(), std::memory_order_release);
    return status;
  }

  // The full position of an unfinished descriptor from its low `bits` bits (a cookie's).
  uint64_t expand(uint64_t low, unsigned bits) const {
    const uint64_t mask = (uint64_t{1} << bits) - 1;
    const uint64_t popped = consumer_.position();
    return popped - ((popped - low) & mask);
  }

  uint64_t popped() const { return consumer_.position(); }  // the proxy thread only
  // Any thread: the consumer's published tail (acquire; pairs with pop_burst()'s release store).
  uint64_t popped_published() const {
    return gpu_side::atomic(ring_.header().consumer.tail).load(std::memory_order_acquire);
  }
  uint64_t unfinished() const { return tracker_.posted() - tracker_.retired_prefix(); }
  // Any thread.
  uint64_t retired() const { return base_ + tracker_.retired_prefix(); }
  // The ring's producer waits on this proxy (a node daemon's client in a wait): keep polling.
  bool producer_waiting() const {
    return gpu_side::atomic(ring_.header().producer.waiting).load(std::memory_order_relaxed) != 0;
  }
  uint64_t reserved() const {
    return gpu_side::atomic(ring_.header().producer.head).load(std::memory_order_acquire);
  }
  uint64_t outstanding(uint64_t target) const {
    return target <= base_ ? 0 : tracker_.outstanding(target - base_);
  }
  std::string tracker_error() const { return tracker_.last_error(); }

  gpu_side::RingConsumer& consumer() { return consumer_; }
  const gpu_side::Doorbell* doorbell() const { return doorbell_; }

 private:
  gpu_side::RingConsumer consumer_;
  gpu_side::Ring ring_;
  const gpu_side::Doorbell* doorbell_;
  control::QuietTracker tracker_;
  std::vector<Entry> entries_;  // index = position & mask_
  uint64_t mask_;
  uint64_t base_;  // ring position of ticket 0
};

}  // namespace proxyep::proxy
