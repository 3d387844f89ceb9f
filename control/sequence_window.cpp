#include "control/sequence_window.hpp"

#include <fmt/format.h>

#include <bit>

namespace proxyep::control {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr auto kAcquire = std::memory_order_acquire;
constexpr auto kRelease = std::memory_order_release;
constexpr auto kAcqRel = std::memory_order_acq_rel;
constexpr auto kSeqCst = std::memory_order_seq_cst;
constexpr uint64_t kWordBits = 64;
constexpr uint16_t kHalfSeq = imm::kSeqModulus / 2;

uint32_t checked_window(uint32_t window, const char* phase) {
  require(window >= 1 && window <= imm::kMaxWindow && std::has_single_bit(window), phase,
          "window {} must be a power of two in [1, {}] (16-bit sequences wrap)", window,
          imm::kMaxWindow);
  return window;
}
}  // namespace

PrefixWindow::PrefixWindow(uint64_t capacity, uint64_t start)
    : capacity_(capacity), shift_(0), tail_(start) {
  require(capacity >= 1 && std::has_single_bit(capacity), "control.prefix_window",
          "capacity {} must be a power of two", capacity);
  shift_ = static_cast<uint32_t>(std::countr_zero(capacity));
  uint64_t words = (capacity + kWordBits - 1) / kWordBits;
  words_ = std::make_unique<std::atomic<uint64_t>[]>(words);
  for (uint64_t w = 0; w < words; ++w)
    words_[w].store(0, kRelaxed);
  // Every position of the first window reads "not done": its slot holds the previous lap's
  // parity (lap - 1; for lap 0 that is 1, by unsigned wrap).
  for (uint64_t p = start; p < start + capacity; ++p) {
    uint64_t slot = p & (capacity - 1);
    uint64_t bit = uint64_t{1} << (slot % kWordBits);
    if (lap_bit(p) == 0) words_[slot / kWordBits].fetch_or(bit, kRelaxed);
  }
}

bool PrefixWindow::completed(uint64_t p) const {
  uint64_t tail = this->tail();
  if (p < tail) return true;
  return p - tail < capacity_ && done(p);
}

bool PrefixWindow::done(uint64_t p) const {
  uint64_t slot = p & (capacity_ - 1);
  uint64_t word = words_[slot / kWordBits].load(kSeqCst);  // partner: mark()'s CAS of the bit
  return ((word >> (slot % kWordBits)) & 1u) == lap_bit(p);
}

PrefixWindow::Mark PrefixWindow::mark(uint64_t p) {
  uint64_t tail = tail_.load(kSeqCst);
  if (p < tail) return Mark::behind;
  if (p - tail >= capacity_) return Mark::beyond;
  uint64_t slot = p & (capacity_ - 1);
  uint64_t bit = uint64_t{1} << (slot % kWordBits);
  uint64_t want = lap_bit(p) << (slot % kWordBits);
  std::atomic<uint64_t>& word = words_[slot / kWordBits];
  uint64_t old = word.load(kRelaxed);
  do {
    if ((old & bit) == want) return Mark::duplicate;
    // seq_cst: releases what this thread saw (the landed chunk) to the advancer's load of the
    // bit, and orders before our load of tail_ in advance() (Dekker with the advancers' CAS).
  } while (!word.compare_exchange_weak(old, old ^ bit, kSeqCst, kRelaxed));
  advance();
  return Mark::ok;
}

void PrefixWindow::advance() {
  uint64_t tail = tail_.load(kSeqCst);
  while (done(tail)) {
    // seq_cst CAS: partner of the consumer's acquire load in tail() and of markers' loads.
    if (tail_.compare_exchange_weak(tail, tail + 1, kSeqCst, kSeqCst)) ++tail;
  }
}

SequenceWindow::SequenceWindow(uint32_t window, uint16_t start)
    : window_(checked_window(window, "control.sequence_window"), start) {}

Status SequenceWindow::complete(uint16_t seq) {
  uint64_t tail = window_.tail();
  auto distance = static_cast<uint16_t>(seq - static_cast<uint16_t>(tail));
  uint64_t w = window_.capacity();
  if (distance >= w) {
    if (distance > kHalfSeq)
      return error_.note(
          fmt::format("chunk seq {} is behind the tail {} by {}: a duplicate of a "
                      "retired chunk",
                      seq, static_cast<uint16_t>(tail), imm::kSeqModulus - distance));
    return error_.note(
        fmt::format("chunk seq {} is beyond the window [{}, {}+{}): the sender posted "
                    "without credit",
                    seq, static_cast<uint16_t>(tail), static_cast<uint16_t>(tail), w));
  }
  switch (window_.mark(tail + distance)) {
    case PrefixWindow::Mark::ok:
      return Status::ok;
    case PrefixWindow::Mark::duplicate:
    case PrefixWindow::Mark::behind:
      return error_.note(fmt::format("chunk seq {} completed twice (duplicate)", seq));
    case PrefixWindow::Mark::beyond:
      break;
  }
  return error_.note(fmt::format("chunk seq {} is beyond the window", seq));
}

SenderCredits::SenderCredits(uint32_t window, uint16_t start)
    : window_(checked_window(window, "control.sender_credits")), posted_(start), acked_(start) {}

Status SenderCredits::acquire(uint16_t& seq) {
  uint64_t posted = posted_.load(kRelaxed);  // only this thread stores posted_
  uint64_t acked = acked_.load(kAcquire);    // partner: credit()'s CAS of acked_
  if (posted - acked >= window_) return Status::again;
  seq = static_cast<uint16_t>(posted);
  posted_.store(posted + 1, kRelease);  // partner: credit()'s acquire load of posted_
  return Status::ok;
}

Status SenderCredits::credit(uint16_t tail) {
  uint64_t acked = acked_.load(kAcquire);
  for (;;) {
    uint64_t posted = posted_.load(kAcquire);  // partner: acquire()'s release store
    auto distance = static_cast<uint16_t>(tail - static_cast<uint16_t>(acked));
    if (distance == 0 || distance > kHalfSeq) return Status::ok;  // nothing new, or stale
    if (distance > posted - acked)
      return error_.note(
          fmt::format("credit up to seq {} but only seqs before {} were posted "
                      "(acknowledged up to {})",
                      tail, static_cast<uint16_t>(posted), static_cast<uint16_t>(acked)));
    // CAS-max; acq_rel pairs with acquire()'s load and with concurrent credit() calls.
    if (acked_.compare_exchange_weak(acked, acked + distance, kAcqRel, kAcquire)) return Status::ok;
  }
}

uint32_t SenderCredits::available() const {
  uint64_t acked = acked_.load(kAcquire);  // first: acked <= posted read below
  uint64_t in_flight = posted_.load(kAcquire) - acked;
  return in_flight >= window_ ? 0 : static_cast<uint32_t>(window_ - in_flight);
}

}  // namespace proxyep::control
