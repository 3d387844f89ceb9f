// CounterBank: the receiver side of "count immediates" (docs EFA_LIBFABRIC.md 5.1 A). Proxy
// threads report every remote write of op counter (its epoch tag and key); the consumer states
// how many writes each key expects in an epoch; when a key has seen exactly that many, its flag
// is raised, once. Counters are signed and banked by epoch, so writes that land before the
// expected count is known are never lost, and one epoch's writes never count toward another's.
//
// Counting protocol (one slot per key per bank, K = kKnownBias = 2^62):
//   value starts at 0; every arrival adds 1; set_expected(n) adds K - n (once per epoch).
//   So value = arrivals - expected + K once the expectation is set, and value = arrivals < K
//   before. The operation whose atomic add makes value == K raises the flag.
// Proof that exactly one operation raises, and only when arrivals == expected:
//   All adds are RMWs on one atomic, so they have one modification order and each sees the
//   value just before it. Before set_expected, value = arrivals <= 2^40 < K: nobody raises.
//   set_expected's add yields K + a - n, where a = arrivals ordered before it: if a == n it
//   raises; if a > n it reports "too many". After it only +1 steps remain, so the value passes
//   each integer at most once: if a < n, exactly the arrival that makes a == n sees K (and
//   every later arrival sees > K: "too many"). No other operation sees K. Keys expecting 0
//   raise inside set_expected.
//
// Epochs: 4 banks, bank = epoch mod 4 = the imm's 2-bit tag. Around the current epoch e the
// banks of e-1 (late writes), e and e+1 (early writes from senders already ahead) accept; the
// fourth tag (e-2, or e+2) is rejected as stale/early with Status::error. begin_epoch(e+1)
// retires epoch e-1: it waits for arrivals already inside that bank, checks that every key of
// it is drained (no arrivals without an expectation, every expectation met exactly), reports
// a LEAK naming the keys otherwise, and resets the bank for epoch e+3.
//
// Threads: arrive() from any number of proxy threads at once; set_expected(), begin_epoch() and
// the flag reads from the consumer (one thread at a time; set_expected may run concurrently
// with arrive()). Flags hold flag_value(epoch) once raised (0 after a reset), so a consumer --
// host thread or GPU kernel polling mapped memory -- compares against its own epoch.
//
// Atomics and their partners:
// - Slot::value: acq_rel adds (arrive, set_expected); each add releases what its thread knew
//   (e.g. the landed bytes of its write) and acquires every earlier add, so the raiser has seen
//   all writes of the key. begin_epoch's loads are ordered by Bank::active (below).
// - Slot::expected: CAS by set_expected (relaxed), published by its later release add to value;
//   read (relaxed) by an arrival whose acquire add saw that add.
// - flags: release store by the raiser pairs with the consumer's acquire load in ready()/flag().
// - epoch_ and Bank::active (Dekker, seq_cst both sides): arrive() increments its bank's active,
//   then loads epoch_; begin_epoch() stores epoch_, then loads active until 0. Either the
//   arrival sees the new epoch (and is rejected without touching the bank) or begin_epoch sees
//   it inside and waits for its release decrement, whose count the leak check then sees
//   (acquire load of active). Arrivals of later epochs read epoch_ (seq_cst load, acquire) after
//   begin_epoch's reset stores, which precede the next epoch_ store in program order.
#pragma once

#include "common/error.hpp"
#include "common/error_note.hpp"
#include "control/imm_layout.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace proxyep::control {

class CounterBank {
 public:
  // Called by whichever thread raised a flag (a proxy thread, or the consumer inside
  // set_expected), after the flag's release store. E.g. mirror the flag into GPU memory. It
  // runs inside the arrival's bank guard: keep it short, and never call begin_epoch() from it.
  using RaiseHook = std::function<void(uint64_t epoch, uint32_t key)>;

  static constexpr uint32_t kBanks = imm::kEpochTags;
  static constexpr int64_t kKnownBias = int64_t{1} << 62;
  static constexpr uint64_t kMaxExpected = uint64_t{1} << 40;
  static constexpr size_t kLeakKeysNamed = 8;  // a LEAK error names at most this many keys

  // Keys [0, keys) in every bank; throws proxyep::Error when keys is 0 or above imm::kMaxKeys.
  // The current epoch starts at 0 (window {0, 1}).
  explicit CounterBank(uint32_t keys, RaiseHook on_raise = {});
  ~CounterBank();
  CounterBank(const CounterBank&) = delete;
  CounterBank& operator=(const CounterBank&) = delete;

  // A remote write of op counter landed. Errors (Status::error, last_error() says which): key
  // out of range, an epoch tag outside {e-1, e, e+1}, more arrivals than expected.
  [[nodiscard]] Status arrive(uint32_t epoch_tag, uint32_t key);

  // The number of writes `key` receives in `epoch` (which must be e-1, e or e+1). Once per key
  // per epoch. Raises the flag at once if they have all arrived (or count is 0). Errors: epoch
  // outside the window, a second expectation, count above kMaxExpected, too many arrivals.
  [[nodiscard]] Status set_expected(uint64_t epoch, uint32_t key, uint64_t count);

  // Makes `epoch` current; it must be the current epoch + 1 (else throws proxyep::Error).
  // Retires epoch - 2: waits for arrivals inside its bank, checks and resets every key (O(keys);
  // the reset happens even when a leak is reported). Status::error on a LEAK (last_leak()).
  [[nodiscard]] Status begin_epoch(uint64_t epoch);

  // Rank masking (a protocol that carries on without a lost peer): while a key is ignored its
  // arrivals are dropped (counted in ignored_arrivals()) whatever their epoch, and retiring an
  // epoch does not call it a leak. Consumer thread.
  void ignore_key(uint32_t key, bool ignored);
  bool ignored(uint32_t key) const {
    return key < keys_ && ignored_[key].load(std::memory_order_acquire);
  }
  uint64_t ignored_arrivals() const { return ignored_arrivals_.load(std::memory_order_relaxed); }
  // Withdraws the expectation of `key` in `epoch` (e - 1, e or e + 1) when it has not been met,
  // so a peer given up mid-call leaves no leak behind. No-op without one. Consumer thread; the
  // key should be ignored first (an arrival racing with it could count otherwise).
  void cancel_expected(uint64_t epoch, uint32_t key);

  // Has `key` reached its expected count in `epoch`? (acquire: the landed data is visible)
  bool ready(uint64_t epoch, uint32_t key) const;
  // The raw flag word, for pollers that compare it with flag_value(epoch) themselves.
  const std::atomic<uint32_t>& flag(uint64_t epoch, uint32_t key) const;
  static constexpr uint32_t flag_value(uint64_t epoch) {
    return 0x80000000u | (static_cast<uint32_t>(epoch) & 0x7fffffffu);
  }

  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  uint32_t keys() const { return keys_; }
  // The most recent error's description, from any thread (when several threads fail at once,
  // one of them); empty when none happened.
  std::string last_error() const { return error_.last(); }
  // The last LEAK report of begin_epoch() (consumer thread), unaffected by arrivals' errors.
  const std::string& last_leak() const { return last_leak_; }
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

 private:
  static constexpr int64_t kUnset = -1;
  struct Slot {
    std::atomic<int64_t> value{0};
    std::atomic<int64_t> expected{kUnset};
  };
  struct Bank {
    alignas(64) std::atomic<uint64_t> active{0};  // arrivals inside this bank right now
    std::unique_ptr<Slot[]> slots;
    std::unique_ptr<std::atomic<uint32_t>[]> flags;
  };

  // Absolute epoch of `tag` in the window around `current`; false when the tag is outside it.
  static bool resolve(uint32_t tag, uint64_t current, uint64_t& epoch);
  bool in_window(uint64_t epoch) const;
  Bank& bank_of(uint64_t epoch) { return banks_[imm::epoch_tag(epoch)]; }
  const Bank& bank_of(uint64_t epoch) const { return banks_[imm::epoch_tag(epoch)]; }
  // Applies one add to a slot and acts on the value it produced (raise / too many).
  Status apply(Bank& bank, uint64_t epoch, uint32_t key, int64_t delta, const char* by);
  void raise(Bank& bank, uint64_t epoch, uint32_t key);
  Status retire(uint64_t epoch);  // leak check + reset of epoch's bank
  Status note(std::string message);

  uint32_t keys_;
  RaiseHook on_raise_;
  std::unique_ptr<std::atomic<bool>[]> ignored_;  // per key
  std::atomic<uint64_t> ignored_arrivals_{0};
  Bank banks_[kBanks];
  alignas(64) std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> errors_{0};
  ErrorNote error_;
  std::string last_leak_;  // consumer thread only
};

}  // namespace proxyep::control
