// The daemon's side and the client's side of the signal relay (signal_relay.hpp).
#include "proxy/signal_relay.hpp"

#include "gpu_side/descriptor.hpp"

#include <fmt/format.h>

#include <span>

namespace proxyep::proxy {

Status RelaySender::relay(uint32_t imm) {
  gpu_side::Descriptor d;
  d.op = gpu_side::Op::signal;
  d.imm = imm;
  std::lock_guard lock(mutex_);
  if (producer_.try_push(d) != Status::ok)
    return error_.note(fmt::format(
        "the client's signal relay is full ({} immediates unread): the client stopped draining "
        "it",
        kRelaySlots));
  ++relayed_;
  return Status::ok;
}

Status RelayReceiver::drain() {
  for (;;) {
    const size_t count = consumer_.pop_burst(std::span(burst_));
    for (size_t i = 0; i < count; ++i) {
      gpu_side::Descriptor d;
      if (gpu_side::decode(burst_[i], d) != gpu_side::DecodeResult::ok)
        return router_.refuse(fmt::format("relay slot {} does not decode", received_ + i));
      if (router_.route(d.imm) != Status::ok) return Status::error;
    }
    received_ += count;
    if (count < burst_.size()) return Status::ok;
  }
}

}  // namespace proxyep::proxy
