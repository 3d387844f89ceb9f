// SignalWords (signal_words.hpp).
#include "control/signal_words.hpp"

#include <fmt/format.h>

#include <atomic>
#include <utility>

namespace proxyep::control {

namespace {

// Checked before anything is allocated.
uint32_t checked(uint32_t count) {
  require(count >= 1 && count - 1 <= imm::PayloadField::kMax, "control.signal_words",
          "{} signal words: an immediate names 1 .. {}", count,
          uint64_t{imm::PayloadField::kMax} + 1);
  return count;
}

}  // namespace

SignalWords::SignalWords(uint32_t count)
    : count_(checked(count)), memory_(HostMemory::heap(bytes_for(count))) {}

SignalWords::SignalWords(uint32_t count, HostMemory memory)
    : count_(checked(count)), memory_(std::move(memory)) {
  require(memory_.size() >= bytes_for(count_), "control.signal_words",
          "{} signal words need {} bytes; the memory has {}", count_, bytes_for(count_),
          memory_.size());
}

Status SignalWords::count(uint32_t index) {
  if (index >= count_)
    return error_.note(fmt::format("signal word {} does not exist (there are {})", index, count_));
  std::atomic_ref<uint64_t>(words()[index]).fetch_add(1, std::memory_order_release);
  return Status::ok;
}

}  // namespace proxyep::control
