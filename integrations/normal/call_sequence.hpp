// CallSequence: the numbering of a Buffer's calls, and what happens when one fails midway.
// Every dispatch and combine is call k of a sequence every rank numbers alike; the session's
// epoch follows it. A call that fails in a step that leaves the ranks out of step (a timeout, a
// peer gone, writes left over) breaks the sequence: every later call refuses, naming that
// failure, instead of waiting for peers that are in another call. Bad input found before
// anything is sent does not break it.
#pragma once

#include "common/error.hpp"
#include "proxy/session.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace proxyep::integrations::normal {

class CallSequence {
 public:
  explicit CallSequence(proxy::Session& session) : session_(session) {}

  // Throws proxyep::Error(phase) when an earlier call broke the sequence or the transport
  // failed.
  void check_usable(std::string_view phase) const;
  // Starts the next call (breaking on failure). Returns its number.
  uint64_t begin();
  uint64_t calls() const { return next_; }

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
  proxy::Session& session_;
  uint64_t next_ = 0;
  std::string broken_;  // the failure that broke the sequence; empty while it holds
};

}  // namespace proxyep::integrations::normal
