// Call numbering, slot proofs and broken sequences (call_sequence.hpp).
#include "integrations/call_sequence.hpp"

#include "integrations/await_every.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace proxyep::integrations {

void CallSequence::check_usable(std::string_view phase) const {
  if (!broken_.empty())
    fail(std::string(phase),
         "an earlier call failed ({}); the ranks are out of step: create a new Buffer", broken_);
  session_.check_health(phase);
}

void CallSequence::check_can_begin(CallKind kind, std::string_view phase) const {
  if (kind == CallKind::sync)
    require(in_flight_.empty(), phase,
            "low-latency call(s) {} are still in flight: call their hook (or wait for their "
            "event) first",
            fmt::join(in_flight_, ", "));
  else
    require(static_cast<int>(in_flight_.size()) < kMaxDeferredInFlight, phase,
            "two low-latency calls ({}) are already in flight: call the hook of one of them "
            "first (their receive buffers would be overwritten)",
            fmt::join(in_flight_, ", "));
}

uint64_t CallSequence::begin(CallKind kind, std::string_view phase,
                             const gpu_side::device::DeviceRuntime* rows_device) {
  check_can_begin(kind, phase);
  const uint64_t call = next_++;
  kinds_[call % kinds_.size()] = kind;
  if (kind == CallKind::deferred) in_flight_.push_back(call);
  step([&] {
    session_.begin_call(call, rows_device);
    for (uint64_t read : unreleased_)
      release(read, phase);
  });
  unreleased_.clear();
  return call;
}

void CallSequence::finish_deferred(uint64_t call, std::string_view phase) {
  std::erase(in_flight_, call);
  if (next_ > call + 1)
    step([&] { release(call, phase); });
  else
    unreleased_.push_back(call);
}

void CallSequence::release(uint64_t call, std::string_view phase) {
  for (int s = 0; s < session_.ranks(); ++s)
    if (active(s)) session_.channel(s).release(call, phase);
}

void CallSequence::await_slots_free(uint64_t call, std::string_view phase) {
  if (call < 2) return;
  const int R = session_.ranks();
  if (kind_of(call - 2) == CallKind::deferred) {
    step([&] {
      for (int d = 0; d < R; ++d)
        if (active(d)) session_.channel(d).expect_release(call - 2, phase);
      await_every(
          session_, [&](int d) { return !active(d) || session_.channel(d).released(call - 2); },
          phase, "the release of the call before last (its receive phase)", lost_policy(call));
    });
    return;
  }
  // A sync call k - 2: the peer's record of call k - 1 proves it finished k - 2. A sync call k
  // got it already (this rank received call k - 1 before starting k).
  if (kind_of(call) == CallKind::sync) return;
  step([&] {
    await_every(
        session_, [&](int d) { return !active(d) || session_.channel(d).record_arrived(call - 1); },
        phase, "the record of the previous call (slots still being read)", lost_policy(call));
  });
}

}  // namespace proxyep::integrations
