// A non-zero rank's side of the TCP bootstrap star. The constructor connects to rank 0 at
// MASTER_ADDR:MASTER_PORT, retrying with a short backoff until the timeout (rank 0 may start
// later), answers rank 0's challenge with its hello (and proof of the job's secret), checks that
// rank 0 serves this job, and waits for the welcome, whose proof it checks before it trusts rank
// 0 (control/rendezvous_auth.hpp); run() sends one contribution and waits for the result. A
// refusal by rank 0 arrives as an abort frame and fails this rank with rank 0's reason; a
// connection rank 0 closed without one before the welcome (dropped from its cap on unscreened
// connections) is made again, with backoff, within the same timeout.
//
// Deadlines: a wait for rank 0 runs for the timeout plus verdict_grace(). Rank 0 starts its
// own clock no later than we do (it listens before it accepts us; it sends `enter` when it joins
// a collective, which restarts our clock), so when ranks are missing, rank 0's abort naming them
// arrives before our deadline and we fail with the names. Only when rank 0 itself is absent or
// stuck do we fail on our own deadline, naming rank 0.
#pragma once

#include "control/framed_connection.hpp"
#include "control/rendezvous_auth.hpp"
#include "control/star_endpoint.hpp"

#include <memory>
#include <string>

namespace proxyep::control {

class StarClient final : public StarEndpoint {
 public:
  explicit StarClient(EndpointContext context);
  ~StarClient() override;

  wire::Bytes run(const CollectiveCall& call, std::span<const uint8_t> mine) override;
  void abort(const std::string& reason) noexcept override;

 private:
  void connect_to_server(const Deadline& deadline);
  void handshake();
  wire::Challenge receive_challenge(std::chrono::milliseconds wait);
  // Fails unless rank 0's welcome arrives in time and, with a secret, proves it for `claims`.
  void receive_welcome(const HandshakeClaims& claims, std::chrono::milliseconds wait);
  // Waits for the next frame from rank 0 until `deadline`: nullopt on timeout. Fails the phase
  // at once on an abort frame, a malformed frame or a closed connection (naming rank 0).
  std::optional<wire::Frame> next_frame(const Deadline& deadline, const std::string& phase,
                                        const std::string& during);
  const ProgressFn& progress() const { return *context_.progress; }
  std::string server() const;  // "rank 0 (rendezvous server at host:port)"

  EndpointContext context_;
  std::unique_ptr<FramedConnection> connection_;
  bool handshaking_ = false;            // between the connection and rank 0's welcome
  bool closed_before_welcome_ = false;  // rank 0 closed the connection then (no abort frame)
  std::string lost_;                    // the last such loss, for the final error
};

}  // namespace proxyep::control
