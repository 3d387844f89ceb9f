// Sequence windows: ordering for streams of chunks that a receiver consumes as a prefix (the
// normal-mode "tail" of DeepEP), over a transport that completes writes in any order. Modelled
// on AWS nccl_ofi_msgbuff: wrapping sequence numbers; completed, in-flight and not-started
// sections; status results rather than asserts.
//
// PrefixWindow (the core, also used by QuietTracker): positions are unwrapped uint64 counters.
// Positions in [tail, tail + W) may complete in any order, from any number of threads;
// tail() is the first position not completed, so [start, tail) is the completed prefix. A
// bitmap of W bits (W a power of two) holds one bit per slot (position mod W). A slot's bit is
// never cleared: completing position p sets the bit to the parity of p's lap (p / W), so
// "done(p)" is bit == parity(p / W), and the slot already reads "not done" for p + W, which
// belongs to the next lap. That is what lets the tail advance lock-free: no thread ever has to
// clear a bit that a later lap's completion may be setting at the same time.
//   - mark(p): rejects p < tail (duplicate of a retired position) and p >= tail + W (beyond the
//     window), CASes the bit (rejecting a bit already done: duplicate), then advances.
//   - advance: while done(tail): CAS tail -> tail + 1 (a failed CAS reloads and retries). The
//     tail is a 64-bit counter, so the CAS has no ABA.
// Atomics and their partners:
//   - bitmap words: seq_cst CAS in mark() and seq_cst loads in advance(). Dekker pair with
//     tail_: a marker CASes its bit then loads tail_; an advancer CASes tail_ then loads the
//     next bit. In the single seq_cst order one of them sees the other's write, so a completion
//     is never left behind the tail with nobody advancing over it.
//   - tail_: seq_cst CAS by advancers (a release: it publishes what the markers it read had
//     seen, e.g. the landed chunk bytes) pairs with the consumer's acquire load in tail().
// Caveat: a duplicate mark that races with a whole lap of W later completions can go undetected
// and corrupt the slot; after any error status treat the stream as failed.
//
// SequenceWindow: the receiver's window for one stream; sequence numbers are the 16-bit
// imm::SeqField (W <= 2^15 keeps the wrap unambiguous) and are unwrapped against the tail.
// SenderCredits: the sender's side of the same stream. A sender may post position s only while
// s - acked < W; the receiver returns credits (op credit immediates) carrying its consumed
// tail; credits may arrive reordered: older ones are ignored (up to 2^15 behind).
//   - posted_: written by the one posting thread (release), read (acquire) by credit() to
//     reject credits for chunks never posted.
//   - acked_: CAS-max by credit() (acq_rel, from any thread) pairs with the poster's acquire
//     load in acquire().
#pragma once

#include "common/error.hpp"
#include "common/error_note.hpp"
#include "control/imm_layout.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace proxyep::control {

class PrefixWindow {
 public:
  enum class Mark : uint8_t { ok, behind, beyond, duplicate };

  // capacity: a power of two (throws proxyep::Error otherwise). `start` is the first position.
  PrefixWindow(uint64_t capacity, uint64_t start);

  // Position `p` completed. Any thread.
  Mark mark(uint64_t p);
  // First position not completed; acquire: data of completed positions is visible.
  uint64_t tail() const { return tail_.load(std::memory_order_acquire); }
  uint64_t capacity() const { return capacity_; }
  // Has position `p` completed? (p below the tail, or marked inside the window)
  bool completed(uint64_t p) const;

 private:
  bool done(uint64_t p) const;
  uint64_t lap_bit(uint64_t p) const { return (p >> shift_) & 1u; }
  void advance();

  uint64_t capacity_;
  uint32_t shift_;  // log2(capacity_)
  std::unique_ptr<std::atomic<uint64_t>[]> words_;
  alignas(64) std::atomic<uint64_t> tail_;
};

class SequenceWindow {
 public:
  // window: a power of two in [1, imm::kMaxWindow]; `start`: the stream's first sequence.
  // Throws proxyep::Error otherwise.
  explicit SequenceWindow(uint32_t window, uint16_t start = 0);

  // Chunk `seq` landed (any thread). Status::error for a duplicate or a seq outside
  // [tail, tail + W); last_error() says which.
  [[nodiscard]] Status complete(uint16_t seq);

  // Chunks [start, tail()) all landed: tail() is the unwrapped next sequence, tail16() its
  // 16-bit form. Acquire: the bytes of those chunks are visible to the caller.
  uint64_t tail() const { return window_.tail(); }
  uint16_t tail16() const { return static_cast<uint16_t>(window_.tail()); }
  uint32_t window() const { return static_cast<uint32_t>(window_.capacity()); }
  std::string last_error() const { return error_.last(); }

 private:
  PrefixWindow window_;
  ErrorNote error_;
};

class SenderCredits {
 public:
  // window: as SequenceWindow's (the receiver's); `start`: the stream's first sequence.
  explicit SenderCredits(uint32_t window, uint16_t start = 0);

  // The sequence of the next chunk to post, or Status::again when all W are unacknowledged.
  // One posting thread.
  [[nodiscard]] Status acquire(uint16_t& seq);
  // The receiver has consumed every chunk before `tail` (a credit immediate). Any thread.
  // Stale (reordered) credits are ignored; Status::error for a tail beyond what was posted.
  [[nodiscard]] Status credit(uint16_t tail);

  uint64_t posted() const { return posted_.load(std::memory_order_acquire); }
  uint64_t acked() const { return acked_.load(std::memory_order_acquire); }
  uint32_t available() const;  // credits left, as seen by the caller
  uint32_t window() const { return window_; }
  std::string last_error() const { return error_.last(); }

 private:
  uint32_t window_;
  alignas(64) std::atomic<uint64_t> posted_;
  alignas(64) std::atomic<uint64_t> acked_;
  ErrorNote error_;
};

}  // namespace proxyep::control
