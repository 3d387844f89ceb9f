// Rank 0's side of the TCP bootstrap star. The constructor listens on MASTER_ADDR:MASTER_PORT
// (or bootstrap.interface), admits exactly one connection per rank 1..N-1 after checking its
// handshake, and welcomes them all; run() relays one collective. Everything happens on the
// calling thread, inside these calls: rank 0 reads its clients only while it is itself in a
// collective, so a client's early contribution simply waits in the socket.
//
// Failures it reports (proxyep::Error, phase "bootstrap.rendezvous" or the collective's):
// ranks that did not arrive in time (named), a rank claimed twice, a different WORLD_SIZE or
// protocol version, a rank calling another collective, a rank whose connection closed.
// TcpBootstrap then calls abort(), which tells every connected client the same message.
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

  void listen(const Deadline& deadline);
  void rendezvous();
  void accept_waiting();
  // Reads one pending (not yet identified) connection; returns true when it is done with it
  // (admitted, or dropped as a stray).
  bool screen_pending(Connection& connection);
  void admit(Connection& connection, const wire::Frame& hello);
  void check_joined_peers();

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
  std::vector<Connection> pending_;      // accepted, handshake not yet read
};

}  // namespace proxyep::control
