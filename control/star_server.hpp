// Rank 0's side of the TCP bootstrap star. The constructor listens on MASTER_ADDR:MASTER_PORT
// (or bootstrap.interface), challenges every connection, admits exactly one proven member per
// rank 1..N-1 (control/rendezvous_auth.hpp), and welcomes them all, each with rank 0's proof;
// run() relays one collective. Everything happens on the calling thread, inside these calls:
// rank 0 reads its clients only while it is itself in a collective, so a client's early
// contribution simply waits in the socket.
//
// Strangers (a malformed frame, another protocol version or job id, no or a bad MAC) are
// refused: logged (warning), told why in an abort frame, dropped; the rendezvous goes on and
// their refusals are named if the rank they claimed never arrives. At most kMaxPending
// connections wait for their handshake at once (the oldest is dropped), and each may send at
// most wire::kMaxHandshakeBytes before it is admitted.
//
// Failures it reports (proxyep::Error, phase "bootstrap.rendezvous" or the collective's):
// ranks that did not arrive in time (named, with any refusals), a proven member claiming a rank
// twice or with a different WORLD_SIZE, a rank calling another collective, a rank whose
// connection closed. TcpBootstrap then calls abort(), which tells every connected client the
// same message.
#pragma once

#include "control/framed_connection.hpp"
#include "control/star_endpoint.hpp"

#include <memory>
#include <vector>

namespace proxyep::control {

class StarServer final : public StarEndpoint {
 public:
  explicit StarServer(EndpointContext context);
  ~StarServer() override;

  wire::Bytes run(const CollectiveCall& call, std::span<const uint8_t> mine) override;
  void abort(const std::string& reason) noexcept override;

 private:
  using Connection = std::unique_ptr<FramedConnection>;
  // An accepted connection that has been challenged and has not yet said hello.
  struct Pending {
    Connection connection;
    wire::Nonce nonce{};  // Ns of its challenge
  };

  void listen(const Deadline& deadline);
  void rendezvous();
  void accept_waiting();
  // Reads one pending connection; returns true when it is done with it (admitted or refused).
  bool screen_pending(Pending& pending);
  void admit(Pending& pending, const wire::Frame& frame);
  // Checks that `frame` is a hello of a member of this job and returns that rank's welcome
  // (with rank 0's proof); throws a refusal saying why not. Fills `hello` and `claim` (what the
  // connection claims, for the log) as far as it got.
  wire::Bytes authenticate(const Pending& pending, const wire::Frame& frame, wire::Hello& hello,
                           std::string& claim) const;
  // Logs why, tells the connection (abort frame) and moves it to closing_.
  void refuse(Pending& pending, const std::string& claim, const std::string& reason);
  // Sends what refused connections still have queued, then FIN; drops what they send; closes
  // them when they hang up or their linger (kAbortLinger) runs out.
  void tend_closing();
  // Logs a refused or dropped connection: a warning for the first few, then at debug level.
  void note_stranger(const std::string& what);
  void check_joined_peers();
  // The queued frames reach every joined rank (header.kind names them in errors).
  void flush_to_all(wire::Kind kind, const std::string& phase);

  // One poll slice over the listener and every connection: flushes the writable ones, reads
  // the readable ones.
  void pump(const Deadline& deadline, const std::string& phase);
  // The next frame from `rank`; a malformed one fails `phase` naming the rank.
  std::optional<wire::Frame> pop_checked(int rank, const std::string& phase);
  void send_to_all(const wire::Header& header, std::span<const uint8_t> payload,
                   const std::string& phase);
  void take_contributions(int rank, const CollectiveCall& call, std::vector<wire::Bytes>& parts,
                          std::vector<bool>& have, int& missing);
  wire::Bytes combine(const CollectiveCall& call, std::vector<wire::Bytes>& parts) const;
  const ProgressFn& progress() const { return *context_.progress; }
  std::string address() const;

  EndpointContext context_;
  Socket listener_;
  int port_ = 0;
  std::vector<Connection> peers_;        // index = rank; [0] and ranks not yet joined are null
  std::vector<std::string> identities_;  // "pid P on host H, from ADDR" per joined rank
  std::vector<wire::Bytes> welcomes_;    // per joined rank: its welcome payload (rank 0's MAC)
  std::vector<Pending> pending_;         // accepted and challenged, hello not yet read
  // A refused connection until its abort frame is delivered (a reset would destroy it).
  struct Closing {
    Connection connection;
    Deadline linger;
    bool fin_sent = false;
  };
  std::vector<Closing> closing_;
  std::vector<std::string> refusals_;  // the latest refusals, for the missing-ranks message
  size_t strangers_logged_ = 0;        // refusals and drops logged
  size_t refused_ = 0;                 // refusals in all
};

}  // namespace proxyep::control
