// The TCP implementation of Bootstrap (control/bootstrap.hpp): a star rendezvous over
// MASTER_ADDR:MASTER_PORT, collectives relayed through rank 0.
//
// Protocol (frames in control/bootstrap_wire.hpp):
// - Rendezvous: rank 0 listens (SO_REUSEADDR) and challenges every connection (a fresh nonce,
//   its job id); ranks 1..N-1 connect, retrying with a short backoff until the timeout, and
//   answer with hello{rank, world size, job id, nonce, pid/host, MAC under the job's secret}.
//   Rank 0 refuses (logs, tells, drops) every connection that does not prove it belongs to the
//   job (control/rendezvous_auth.hpp), admits one proven member per rank, and fails the world
//   when proven members conflict (a rank claimed twice, a different WORLD_SIZE). When all have
//   joined it sends each its welcome (with rank 0's own proof), and stops listening.
// - Collective k (k = 1, 2, ... in call order on every rank): rank 0 sends enter(k) to every
//   client, each client sends contribute(k, op, root, phase, data), rank 0 checks that every
//   contribution names the same collective as its own call (else: error naming the rank and
//   both calls), combines them and sends result(k) to all.
// - Failure: whoever fails first sends abort(reason) to the others it is connected to, closes
//   its connections gracefully, and throws. Rank 0 relays a client's failure to every client, so
//   all ranks fail promptly with the same names. After a failure the object is unusable: each
//   call throws at once, repeating the first failure.
//
// Threading: one thread uses a TcpBootstrap at a time (the progress hook runs on that thread,
// between poll slices of at most kPollSlice). Waiting never blocks in the kernel longer than a
// slice; each wait is bounded by the timeout (clients: plus verdict_grace(), see star_client.hpp).
// Errors: proxyep::Error with phase "bootstrap.rendezvous" or "bootstrap.<op>(<caller's phase>)".
#pragma once

#include "control/bootstrap.hpp"
#include "control/liveness.hpp"
#include "control/star_endpoint.hpp"

#include <memory>
#include <string>

namespace proxyep::control {

class TcpBootstrap final : public Bootstrap {
 public:
  explicit TcpBootstrap(Options options);  // performs the rendezvous; throws proxyep::Error
  ~TcpBootstrap() override;

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  const LaunchEnv& env() const override { return env_; }
  void set_progress(std::function<void()> progress) override { progress_ = std::move(progress); }

  std::vector<Bytes> allgather(std::span<const uint8_t> mine, std::string_view phase) override;
  void barrier(std::string_view phase) override;
  void barrier(std::string_view phase, std::chrono::milliseconds timeout) override;
  Bytes broadcast(std::span<const uint8_t> data, int root, std::string_view phase) override;
  const PeerWatch* peer_watch() const override { return liveness_.get(); }

 private:
  // Runs one collective on the endpoint, latching the first failure and aborting the peers.
  Bytes run(wire::Op op, int root, std::string_view phase, std::span<const uint8_t> mine,
            std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

  LaunchEnv env_;
  std::chrono::milliseconds timeout_;
  ProgressFn progress_;
  std::unique_ptr<StarEndpoint> endpoint_;  // null for a world of one
  uint32_t seq_ = 0;                        // collectives called so far
  std::string failure_;                     // the first failure; non-empty = unusable
  // Declared last: destroyed first, saying goodbye while the star is still up.
  std::unique_ptr<Liveness> liveness_;  // null for a world of one
};

}  // namespace proxyep::control
