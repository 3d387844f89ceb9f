// Health: the error state of a proxy engine. Proxy threads record failures (a CQ error, a peer
// that stopped making progress, a descriptor that cannot be translated); everyone who waits on
// the engine (quiet, flag waits, stop) checks it on every spin of its wait loop, so a failure
// reaches every waiter at once instead of leaving it to hang until its own deadline.
//
// The first failure wins and is kept; later ones are logged, not stored, because the first is
// the cause and later ones are usually its consequences (a dead peer fails many writes).
//
// Peer failures (a protocol that carries on without lost ranks, e.g. low-latency calls with rank
// masking): after tolerate_peer_failures(), a failure that names a peer marks only that peer
// failed (peer_failed(), peer_failure()); the engine stays healthy for everyone else. Failures
// that name no peer still fail the engine.
//
// Concurrency: any thread may record(); any thread may read.
// - failed_ is stored with release after the failure record is written under mutex_, and loaded
//   with acquire by failed(); a reader that sees true then takes the mutex to copy the record,
//   so the pairing only makes the fast check cheap, the mutex carries the data.
#pragma once

#include "common/error.hpp"

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::proxy {

struct Failure {
  std::string phase;  // "proxy.post", "proxy.complete", "proxy.peer_timeout", ...
  int peer = -1;      // the rank involved, -1 when unknown
  std::string message;
};

class Health {
 public:
  // Keeps the first failure; returns true when this one was the first.
  bool record(Failure failure);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::optional<Failure> failure() const;
  // Throws proxyep::Error(phase, message) for the recorded failure; no-op when healthy.
  void throw_if_failed() const;

  // Before any failure: from now on failures naming one of `ranks` peers are that peer's only.
  void tolerate_peer_failures(int ranks);
  bool tolerates_peer_failures() const { return !peer_failed_.empty(); }
  bool peer_failed(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < peer_failed_.size() &&
           peer_failed_[static_cast<size_t>(peer)].load(std::memory_order_acquire);
  }
  std::optional<Failure> peer_failure(int peer) const;

 private:
  mutable std::mutex mutex_;
  std::optional<Failure> failure_;
  std::atomic<bool> failed_{false};  // release in record(), acquire in failed()
  // With peer failures tolerated: one flag per rank (release after the record below), and the
  // first failure of each peer, under mutex_.
  std::vector<std::atomic<bool>> peer_failed_;
  std::vector<std::optional<Failure>> peer_failures_;
};

}  // namespace proxyep::proxy
