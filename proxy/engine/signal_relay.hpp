// Signal relay: how immediates reach a rank whose proxy is the node daemon (proxyepd).
//
// Remote writes land in the client's memory, but their completions -- the immediates that say
// a record, a chunk or a credit arrived -- come out of the daemon's completion queues. The
// ordering state that decodes them (counter bank, sequence windows, sender credits) stays in
// the client, private to it: the rank's one SignalRouter is the client's. The daemon's proxy
// threads hand each immediate to a RelaySender (the daemon's ImmSink for that rank,
// control/imm_sink.hpp), which passes it on undecoded through a ring in a memfd the client
// created:
//
//   daemon proxy thread: completion -> RelaySender::route(imm)
//                        -> one Op::signal descriptor {imm} into the relay ring
//   client, while it waits: RelayReceiver::drain() -> pops them -> its SignalRouter::route
//
// One exception: control immediates that count the captured steps' signal words
// (attach_words) are counted by the sender itself, in the daemon's mapping of the client's
// words: the client's device waits on them while a graph runs, and no client thread relays
// then.
//
// The client drains the ring in every wait, so a full ring means the client stopped waiting
// for good (or is far behind its peers): route() then fails (Status::error), which fails the
// daemon's proxy for that client with a message saying so, rather than blocking a proxy thread
// that serves other work. Capacity: signals of a few calls at most are outstanding (a peer runs
// at most one call ahead), so 64 Ki slots is generous.
//
// Threads: route() from any number of the daemon's proxy threads (one mutex around the single
// producer; uncontended it costs ~20 ns against a completion's microseconds); drain() from the
// client's protocol thread only.
#pragma once

#include "common/error.hpp"
#include "common/error_note.hpp"
#include "control/imm_sink.hpp"
#include "control/signal_router.hpp"
#include "control/signal_words.hpp"
#include "gpu_side/ring.hpp"

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace proxyep::proxy {

inline constexpr uint64_t kRelaySlots = uint64_t{1} << 16;

class RelaySender final : public control::ImmSink {
 public:
  // `ring`: created by the client (Ring::create, ProducerMode::single), mapped here.
  explicit RelaySender(gpu_side::Ring ring) : producer_(ring), capacity_(ring.capacity()) {}
  // The immediate into the relay ring (or, for attached words, counted here). Status::error
  // when the ring is full: the client stopped draining it.
  [[nodiscard]] Status route(uint32_t imm) override;
  [[nodiscard]] Status refuse(std::string what) override { return error_.note(std::move(what)); }
  std::string last_error() const override { return error_.last(); }
  void attach_words(control::SignalWords& words) override;
  uint64_t relayed() const {
    std::lock_guard lock(mutex_);
    return relayed_;
  }

 private:
  mutable std::mutex mutex_;
  gpu_side::RingProducer producer_;
  uint64_t capacity_;
  uint64_t relayed_ = 0;
  ErrorNote error_;
  control::SignalWords* words_ = nullptr;
};

class RelayReceiver {
 public:
  // `router`: the client's, with its counter bank, windows and credits attached; it must
  // outlive the receiver.
  RelayReceiver(gpu_side::Ring ring, control::SignalRouter& router)
      : consumer_(ring), router_(router) {}
  // Routes every immediate the ring holds now. Status::error when the router refused one
  // (router's last_error() says which and why); the ones behind it stay for the next drain.
  [[nodiscard]] Status drain();
  uint64_t received() const { return received_; }
  // Why the router refused an immediate (drain() returned Status::error).
  std::string last_error() const { return router_.last_error(); }

 private:
  gpu_side::RingConsumer consumer_;
  control::SignalRouter& router_;
  std::array<gpu_side::WireDescriptor, 64> burst_{};
  // burst_[next_, popped_) were popped (their slots already freed) but not routed yet: what a
  // refusal left behind.
  size_t next_ = 0;
  size_t popped_ = 0;
  uint64_t received_ = 0;
};

}  // namespace proxyep::proxy
