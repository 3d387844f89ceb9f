// The daemon's side and the client's side of the signal relay (signal_relay.hpp).
#include "proxy/engine/signal_relay.hpp"

#include "control/imm_layout.hpp"
#include "gpu_side/descriptor.hpp"

#include <fmt/format.h>

#include <span>

namespace proxyep::proxy {

void RelaySender::attach_words(control::SignalWords& words) {
  require(words_ == nullptr, "proxy.signal_relay", "signal words are already attached");
  words_ = &words;
}

Status RelaySender::route(uint32_t imm) {
  // Decoded only once the steps' words are attached: until then every immediate goes on as is.
  if (words_ != nullptr)
    if (const control::imm::Decoded decoded = control::imm::decode(imm);
        decoded.op() == control::imm::Op::control) {
      if (words_->count(decoded.payload()) == Status::ok) return Status::ok;
      return error_.note(fmt::format("imm {:#010x} (control, payload {:#x}): {}", imm,
                                     decoded.payload(), words_->last_error()));
    }
  gpu_side::Descriptor d;
  d.op = gpu_side::Op::signal;
  d.imm = imm;
  std::lock_guard lock(mutex_);
  if (producer_.try_push(d) != Status::ok)
    return error_.note(fmt::format(
        "imm {:#010x}: the client's signal relay is full ({} immediates unread): the client "
        "stopped draining it",
        imm, capacity_));
  ++relayed_;
  return Status::ok;
}

Status RelayReceiver::drain() {
  for (;;) {
    if (next_ == popped_) {
      popped_ = consumer_.pop_burst(std::span(burst_));
      next_ = 0;
      if (popped_ == 0) return Status::ok;
    }
    for (; next_ < popped_; ++next_) {
      gpu_side::Descriptor d;
      if (gpu_side::decode(burst_[next_], d) != gpu_side::DecodeResult::ok) {
        ++next_;  // a slot that does not decode is dropped with the error
        ++received_;
        return router_.refuse(fmt::format("relay slot {} does not decode", received_ - 1));
      }
      ++received_;
      if (router_.route(d.imm) != Status::ok) {
        ++next_;
        return Status::error;
      }
    }
  }
}

}  // namespace proxyep::proxy
