// ImmSink: where a proxy thread hands the immediate of every remote-write completion. Two kinds,
// one per rank:
//   SignalRouter (signal_router.hpp)      decodes it into the rank's counters, windows, credits
//                                         and words: the rank's one router, in its own process
//   RelaySender (proxy/engine/signal_relay.hpp)  in the node daemon: passes it on undecoded to the
//                                         rank's process, whose router decodes it; counts only
//                                         the captured steps' words itself
// Threads: attach_words() during setup (or while no proxy thread is in a pass:
// ProxyEngine::amend); route() and refuse() from any number of proxy threads at once.
#pragma once

#include "common/error.hpp"
#include "control/signal_words.hpp"

#include <cstdint>
#include <string>

namespace proxyep::control {

class ImmSink {
 public:
  virtual ~ImmSink() = default;
  // Takes one immediate. Status::error when it cannot; last_error() says which and why.
  [[nodiscard]] virtual Status route(uint32_t imm) = 0;
  // Records `what` as last_error() and returns Status::error: for a caller that refuses something
  // on the sink's behalf (proxy/engine/route_completion.hpp: a completion that is not a signal).
  [[nodiscard]] virtual Status refuse(std::string what) = 0;
  virtual std::string last_error() const = 0;
  // Control immediates count these words (signal_words.hpp) from now on; once. The words must
  // outlive the sink's use.
  virtual void attach_words(SignalWords& words) = 0;
};

}  // namespace proxyep::control
