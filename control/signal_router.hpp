// SignalRouter: what a proxy thread calls on every remote_write completion (with its immediate:
// proxy/engine/route_completion.hpp takes the fabric's completion). It decodes the 32-bit immediate
// (control/imm_layout.hpp) and dispatches it:
//   counter -> CounterBank::arrive(epoch tag, key)
//   stream  -> the SequenceWindow attached for that stream id: complete(seq)
//   credit  -> the SenderCredits attached for that stream id: credit(tail)
//   control -> the SignalWords attached (the payload names the word it counts up), or else the
//              control handler, if one is set
// Stream and credit immediates carry an epoch tag too, but the router ignores it: streams live
// across epochs and their sequence numbers order them.
//
// Threads: attach_*() and set_control_handler() during setup, before any route(); route() from
// any number of proxy threads at once afterwards (it only reads the tables; the targets are
// thread-safe). Errors are Status values; last_error() describes the latest one, naming the
// immediate and what the target reported.
#pragma once

#include "common/error.hpp"
#include "common/error_note.hpp"
#include "control/counter_bank.hpp"
#include "control/imm_layout.hpp"
#include "control/imm_sink.hpp"
#include "control/sequence_window.hpp"
#include "control/signal_words.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace proxyep::control {

class SignalRouter final : public ImmSink {
 public:
  using ControlHandler = std::function<Status(uint32_t epoch_tag, uint32_t payload)>;

  SignalRouter();

  // Setup; each throws proxyep::Error for a stream id out of range or attached twice.
  void attach_counters(CounterBank& counters);
  void attach_stream(uint32_t stream, SequenceWindow& window);
  void attach_credits(uint32_t stream, SenderCredits& credits);
  void set_control_handler(ControlHandler handler);
  // Control immediates count these words (signal_words.hpp) instead of reaching the handler.
  void attach_words(SignalWords& words) override;

  // Dispatches one immediate. Status::error when nothing is attached for it or the target
  // rejects it.
  [[nodiscard]] Status route(uint32_t imm) override;
  // Records `what` as last_error() and returns Status::error: for a caller that refuses
  // something on the router's behalf (proxy/engine/route_completion.hpp: a completion that is not a
  // signal).
  [[nodiscard]] Status refuse(std::string what) override;

  std::string last_error() const override { return error_.last(); }

 private:
  Status note(uint32_t imm, const std::string& what);

  CounterBank* counters_ = nullptr;
  SignalWords* words_ = nullptr;
  std::vector<SequenceWindow*> streams_;  // by stream id, imm::kMaxStreams entries
  std::vector<SenderCredits*> credits_;   // by stream id, imm::kMaxStreams entries
  ControlHandler control_;
  ErrorNote error_;
};

}  // namespace proxyep::control
