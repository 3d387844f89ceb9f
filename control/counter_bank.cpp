#include "control/counter_bank.hpp"

#include <fmt/format.h>

#include <thread>
#include <vector>

namespace proxyep::control {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr auto kAcquire = std::memory_order_acquire;
constexpr auto kRelease = std::memory_order_release;
constexpr auto kAcqRel = std::memory_order_acq_rel;
constexpr auto kSeqCst = std::memory_order_seq_cst;
}  // namespace

CounterBank::CounterBank(uint32_t keys, RaiseHook on_raise)
    : keys_(keys), on_raise_(std::move(on_raise)) {
  require(keys > 0 && keys <= imm::kMaxKeys, "control.counter_bank",
          "{} keys requested; the immediate's key field holds 1..{}", keys, imm::kMaxKeys);
  ignored_ = std::make_unique<std::atomic<bool>[]>(keys);
  for (uint32_t k = 0; k < keys; ++k)
    ignored_[k].store(false, kRelaxed);
  for (Bank& bank : banks_) {
    bank.slots = std::make_unique<Slot[]>(keys);
    bank.flags = std::make_unique<std::atomic<uint32_t>[]>(keys);
    for (uint32_t k = 0; k < keys; ++k)
      bank.flags[k].store(0, kRelaxed);
  }
}

CounterBank::~CounterBank() = default;

bool CounterBank::resolve(uint32_t tag, uint64_t current, uint64_t& epoch) {
  for (uint64_t candidate : {current + 1, current, current - 1}) {
    if (candidate == ~uint64_t{0}) continue;  // current 0 has no e-1
    if (imm::epoch_tag(candidate) == tag) {
      epoch = candidate;
      return true;
    }
  }
  return false;
}

bool CounterBank::in_window(uint64_t epoch) const {
  uint64_t current = epoch_.load(kAcquire);
  return epoch + 1 >= current && epoch <= current + 1;
}

Status CounterBank::arrive(uint32_t epoch_tag, uint32_t key) {
  if (key >= keys_)
    return note(fmt::format("counter arrival for key {} (epoch tag {}): only {} keys exist", key,
                            epoch_tag, keys_));
  if (epoch_tag >= kBanks) return note(fmt::format("counter arrival with epoch tag {}", epoch_tag));
  if (ignored_[key].load(kAcquire)) {  // a masked peer's write, late or not
    ignored_arrivals_.fetch_add(1, kRelaxed);
    return Status::ok;
  }
  Bank& bank = banks_[epoch_tag];
  // Dekker entry: seq_cst increment, then seq_cst load of epoch_ (partner: begin_epoch's store
  // of epoch_ followed by its load of active).
  bank.active.fetch_add(1, kSeqCst);
  uint64_t current = epoch_.load(kSeqCst);
  uint64_t epoch = 0;
  if (!resolve(epoch_tag, current, epoch)) {
    bank.active.fetch_sub(1, kRelease);  // partner: begin_epoch's acquire load of active
    return note(fmt::format(
        "counter arrival for key {} with epoch tag {} while the current epoch is {}: stale "
        "(epoch {}) or early (epoch {}); only epochs {}..{} are accepted",
        key, epoch_tag, current, current >= 2 ? std::to_string(current - 2) : "<0", current + 2,
        current == 0 ? 0 : current - 1, current + 1));
  }
  Status status = apply(bank, epoch, key, 1, "an arrival");
  bank.active.fetch_sub(1, kRelease);  // partner: begin_epoch's acquire load of active
  return status;
}

Status CounterBank::set_expected(uint64_t epoch, uint32_t key, uint64_t count) {
  if (key >= keys_)
    return note(
        fmt::format("set_expected for key {} (epoch {}): only {} keys exist", key, epoch, keys_));
  if (count > kMaxExpected)
    return note(fmt::format("set_expected for key {} (epoch {}): count {} exceeds {}", key, epoch,
                            count, kMaxExpected));
  if (!in_window(epoch))
    return note(fmt::format("set_expected for key {} in epoch {} while the current epoch is {}",
                            key, epoch, this->epoch()));
  Bank& bank = bank_of(epoch);
  Slot& slot = bank.slots[key];
  int64_t previous = kUnset;
  // Relaxed: published by apply()'s release add to value (partner: an arrival's acquire add).
  if (!slot.expected.compare_exchange_strong(previous, static_cast<int64_t>(count), kRelaxed))
    return note(fmt::format("set_expected for key {} in epoch {} twice (first {}, now {})", key,
                            epoch, previous, count));
  return apply(bank, epoch, key, kKnownBias - static_cast<int64_t>(count), "set_expected");
}

Status CounterBank::apply(Bank& bank, uint64_t epoch, uint32_t key, int64_t delta, const char* by) {
  Slot& slot = bank.slots[key];
  // acq_rel: releases this thread's knowledge (landed data) and acquires every earlier add of
  // the key (partners: the other arrivals' and set_expected's adds to the same value).
  int64_t now = slot.value.fetch_add(delta, kAcqRel) + delta;
  if (now == kKnownBias) {
    raise(bank, epoch, key);
    return Status::ok;
  }
  if (now < kKnownBias) return Status::ok;
  int64_t expected = slot.expected.load(kRelaxed);  // visible: our acquire add saw its add
  return note(
      fmt::format("counter key {} in epoch {}: {} arrivals, expected {} (too many; detected by {})",
                  key, epoch, now - kKnownBias + expected, expected, by));
}

void CounterBank::ignore_key(uint32_t key, bool ignored) {
  if (key < keys_) ignored_[key].store(ignored, kRelease);
}

void CounterBank::cancel_expected(uint64_t epoch, uint32_t key) {
  if (key >= keys_ || !in_window(epoch)) return;
  Bank& bank = bank_of(epoch);
  Slot& slot = bank.slots[key];
  int64_t expected = slot.expected.load(kRelaxed);
  if (expected == kUnset || bank.flags[key].load(kAcquire) == flag_value(epoch)) return;
  const int64_t count = expected;
  if (!slot.expected.compare_exchange_strong(expected, kUnset, kRelaxed)) return;
  // Undo set_expected's add: the value counts arrivals only again, as before it.
  slot.value.fetch_add(-(kKnownBias - count), kAcqRel);
}

void CounterBank::raise(Bank& bank, uint64_t epoch, uint32_t key) {
  // partner: the consumer's acquire load in ready()/flag()
  bank.flags[key].store(flag_value(epoch), kRelease);
  if (on_raise_) on_raise_(epoch, key);
}

bool CounterBank::ready(uint64_t epoch, uint32_t key) const {
  if (key >= keys_) return false;
  return bank_of(epoch).flags[key].load(kAcquire) == flag_value(epoch);
}

const std::atomic<uint32_t>& CounterBank::flag(uint64_t epoch, uint32_t key) const {
  require(key < keys_, "control.counter_bank", "flag of key {}: only {} keys exist", key, keys_);
  return bank_of(epoch).flags[key];
}

Status CounterBank::begin_epoch(uint64_t epoch) {
  uint64_t current = epoch_.load(kRelaxed);  // only this (consumer) thread stores epoch_
  require(epoch == current + 1, "control.counter_bank.begin_epoch",
          "epoch {} requested while the current epoch is {}; epochs advance by one", epoch,
          current);
  // Dekker exit: seq_cst store, then seq_cst loads of the retiring bank's active (partner:
  // arrive()'s increment of active followed by its load of epoch_).
  epoch_.store(epoch, kSeqCst);
  if (epoch < 2) return Status::ok;  // epoch - 2 never existed
  Bank& bank = bank_of(epoch - 2);
  while (bank.active.load(kSeqCst) != 0)  // acquire: partner of arrivals' release decrement
    std::this_thread::yield();
  return retire(epoch - 2);
}

Status CounterBank::retire(uint64_t epoch) {
  Bank& bank = bank_of(epoch);
  std::vector<std::string> named;
  uint64_t leaked = 0;
  for (uint32_t key = 0; key < keys_; ++key) {
    Slot& slot = bank.slots[key];
    int64_t value = slot.value.load(kRelaxed);  // ordered by the acquire load of active
    int64_t expected = slot.expected.load(kRelaxed);
    bool clean =
        ignored_[key].load(kAcquire) || (expected == kUnset ? value == 0 : value == kKnownBias);
    if (!clean) {
      if (++leaked <= kLeakKeysNamed)
        named.push_back(expected == kUnset
                            ? fmt::format("key {}: {} arrivals, no expectation", key, value)
                            : fmt::format("key {}: {} arrivals of {} expected", key,
                                          value - kKnownBias + expected, expected));
    }
    // No arrival can enter this bank until the next epoch_ store, which follows these stores.
    slot.value.store(0, kRelaxed);
    slot.expected.store(kUnset, kRelaxed);
    bank.flags[key].store(0, kRelaxed);
  }
  if (leaked == 0) return Status::ok;
  last_leak_ =
      fmt::format("LEAK in epoch {} (retired by begin_epoch({})): {} keys not drained: {}{}", epoch,
                  epoch + 2, leaked, fmt::join(named, "; "), leaked > named.size() ? "; ..." : "");
  return note(last_leak_);
}

Status CounterBank::note(std::string message) {
  errors_.fetch_add(1, kRelaxed);
  return error_.note(std::move(message));
}

}  // namespace proxyep::control
