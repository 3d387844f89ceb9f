// PeerWatch: what a rank knows about peers that left the job while it runs. Waits anywhere above
// the bootstrap (the proxy engine's, the Buffer's) ask it on every poll, so a peer whose process
// died is named at once instead of at the wait's deadline.
//
// Threads: failure() may be called from any thread, any number at once; it is cheap when nobody
// failed (one acquire load).
#pragma once

#include <optional>
#include <string>

namespace proxyep::control {

struct PeerFailure {
  int rank = -1;
  std::string reason;  // "its bootstrap connection closed without a goodbye (...)"
};

class PeerWatch {
 public:
  virtual ~PeerWatch() = default;
  // The first peer known to have left the job without saying goodbye; nullopt while none has.
  virtual std::optional<PeerFailure> failure() const = 0;
  // Whether `rank` is known to have left the job without saying goodbye (any of them, not only
  // the first: a job that carries on without lost ranks needs to know each).
  virtual bool departed(int rank) const {
    auto first = failure();
    return first && first->rank == rank;
  }
};

}  // namespace proxyep::control
