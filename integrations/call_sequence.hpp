// CallSequence: the numbering of a Buffer's calls, whose slots each call may write, and what
// happens when one fails midway. Every call of either mode (normal dispatch and combine,
// low-latency dispatch and combine, clean_low_latency_buffer) is call k of one sequence every
// rank numbers alike; the session's epoch follows it.
//
// Kinds, and why a call may write its peers' slots (call k uses the slots of parity k % 2):
//  - sync (normal mode, the LL agreement): a call returns only after it read everything sent to
//    it. A peer's record of call k - 1 therefore proves it finished call k - 2.
//  - deferred (low-latency calls): the receive phase may run later (a hook, an event), after
//    this rank's next call was sent. At most two are in flight on a rank, as in DeepEP; the
//    third is refused. A peer proves it finished reading a deferred call k - 2 with a release
//    (peer_channel.hpp), sent once it has read call k - 2 AND started call k - 1: so no peer
//    ever runs more than one call ahead of a rank's current call, and every write lands within
//    the epochs the rank's counters accept (e - 1, e, e + 1: control/counter_bank.hpp), even
//    with two calls in flight.
// await_slots_free(k) waits for whichever proof call k needs, for every peer; a sync call also
// needs this rank to have no deferred call in flight.
//
// A call that fails in a step that leaves the ranks out of step (a timeout, a peer gone, writes
// left over) breaks the sequence: every later call refuses, naming that failure, instead of
// waiting for peers that are in another call. Bad input found before anything is sent does not
// break it.
#pragma once

#include "common/error.hpp"
#include "proxy/session/session.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::integrations {

enum class CallKind : uint8_t { sync, deferred };

// Most deferred calls in flight on one rank (DeepEP's two LL buffer halves).
inline constexpr int kMaxDeferredInFlight = 2;

class CallSequence {
 public:
  explicit CallSequence(proxy::Session& session) : session_(session) {}

  // Throws proxyep::Error(phase) when an earlier call broke the sequence or the transport
  // failed.
  void check_usable(std::string_view phase) const;
  // Throws proxyep::Error(phase), without breaking anything, when a call of `kind` may not
  // start now: a sync call while deferred calls are in flight, a third deferred call.
  void check_can_begin(CallKind kind, std::string_view phase) const;
  // Starts the next call (breaking on failure), whose rows `rows_device`'s kernels write and read
  // (its backend's stream; none for a host call: proxy::Session::begin_call). Returns its
  // number. A deferred call stays in flight until finish_deferred().
  uint64_t begin(CallKind kind, std::string_view phase,
                 const gpu_side::device::DeviceRuntime* rows_device);
  // The receive phase of deferred call `call` finished reading every peer's slots: releases
  // them now, or when call + 1 begins.
  void finish_deferred(uint64_t call, std::string_view phase);
  // Waits until every peer finished reading the slots `call` will write (see above).
  void await_slots_free(uint64_t call, std::string_view phase);
  uint64_t calls() const { return next_; }
  // Rank masking: peers for which `active` is false are neither waited for nor released, and a
  // peer lost during a slot wait is offered to `on_lost` (proxy::Wait::on_lost).
  void set_peer_policy(std::function<bool(int)> active,
                       std::function<bool(int, const std::string&)> on_lost) {
    active_ = std::move(active);
    on_lost_ = std::move(on_lost);
  }
  const std::vector<uint64_t>& in_flight() const { return in_flight_; }

  // Runs `step` of a call; an Error from it breaks the sequence and propagates.
  template <typename Step>
  decltype(auto) step(Step&& step) {
    try {
      return step();
    } catch (const Error& e) {
      broken_ = e.what();
      throw;
    }
  }

 private:
  CallKind kind_of(uint64_t call) const { return kinds_[call % kinds_.size()]; }

  proxy::Session& session_;
  uint64_t next_ = 0;
  std::array<CallKind, 4> kinds_{};  // of the last calls, by call % 4
  void release(uint64_t call, std::string_view phase);

  std::vector<uint64_t> in_flight_;   // deferred calls begun and not finished
  std::vector<uint64_t> unreleased_;  // read, to release when the next call begins
  std::function<bool(int)> active_;   // unset: every peer
  std::function<bool(int, const std::string&)> on_lost_;
  bool active(int peer) const { return !active_ || active_(peer); }
  // Only deferred calls carry on without a lost peer; a sync call needs every rank.
  std::function<bool(int, const std::string&)> lost_policy(uint64_t call) const {
    return kind_of(call) == CallKind::deferred ? on_lost_ : nullptr;
  }
  std::string broken_;  // the failure that broke the sequence; empty while it holds
};

}  // namespace proxyep::integrations
