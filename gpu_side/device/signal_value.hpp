// SignalValue: the value a stream's signal operation (DeviceRuntime::wait_value / write_value)
// compares a word with or stores in it.
//
// A plain value is fixed when the operation is queued. A captured graph replays its operations
// with the values they were captured with, so a handshake whose values are plain says "call 1"
// on every replay: the second replay's wait finds the first replay's word and runs ahead. An
// epoch value is taken when the operation runs instead: `offset` plus what the epoch word holds
// then. A graph that advances its epoch word itself (DeviceRuntime::add_value, captured with
// the rest) gives each replay its own numbers: replay n waits for n and signals n.
//
//   graph of one step:  add_value(epoch, 1)                    this step's number n
//                       wait_value(released, {epoch, -1})      the peer read step n - 1
//                       ... copies into the peer's slot ...
//                       write_value(ready, {epoch, 0})         step n is there
//
// Offsets add modulo 2^64, so {epoch, -1} on an epoch of 0 waits for 2^64 - 1: the first step
// of a chain is numbered 1 (advance before the first wait).
//
// `times` scales the epoch for a word raised more than once per step: a word the proxies count
// up once per write that landed (control/signal_words.hpp), a step bringing `times` writes from
// one peer, reaches times * n in step n: {epoch, 0, times}.
#pragma once

#include "common/host_device.hpp"

#include <cstdint>

namespace proxyep::gpu_side::device {

struct SignalValue {
  // A plain value (implicit: every fixed-value call site stays as it was).
  constexpr SignalValue(uint64_t value) : offset(value) {}  // NOLINT(google-explicit-constructor)
  // What the word at `epoch_word` holds when the operation runs, plus `plus`.
  constexpr SignalValue(const uint64_t* epoch_word, int64_t plus, uint64_t times_epoch = 1)
      : epoch(epoch_word), offset(static_cast<uint64_t>(plus)), times(times_epoch) {}

  // The value, given what the epoch word holds when the operation runs (ignored for a plain one).
  PROXYEP_HOST_DEVICE constexpr uint64_t at(uint64_t epoch_now) const {
    return epoch != nullptr ? epoch_now * times + offset : offset;
  }

  const uint64_t* epoch = nullptr;
  uint64_t offset = 0;
  uint64_t times = 1;
};

}  // namespace proxyep::gpu_side::device
