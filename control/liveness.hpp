// Liveness: every rank learns at once that a peer left the job without saying goodbye, and
// which one. The bootstrap's own connections carry collectives and are only read while one runs,
// so a death between collectives would otherwise surface at some wait's deadline (30 s and
// more); here a second star of TCP connections, read all the time by one thread per rank, turns
// the kernel's close of a dead process's sockets into an error naming the rank within
// milliseconds.
//
// Shape: rank 0 listens on an ephemeral port of the bootstrap's interface; the port and a random
// 128-bit token travel in a bootstrap broadcast (so only ranks of this job, which passed the
// bootstrap's rendezvous, can learn them), and every other rank connects and presents the token
// with its rank. Messages (little endian, common/wire.hpp), each behind a u32 length:
//   u32 magic "PXLV" | u16 version | u16 kind | u32 rank | [kind failed: u16 n | n bytes reason]
//   kinds: hello (with a 16-byte token), bye (leaving on purpose), failed (rank 0 relays that
//   `rank` left without a goodbye).
// A connection that closes without a bye means that rank's process died (the kernel closes its
// sockets) or, with keepalive probes, that its host stopped answering. Rank 0 records it and
// relays it to every other rank; a rank whose connection to rank 0 closes without a bye records
// rank 0. A rank that leaves on purpose (its bootstrap is destroyed) says bye first.
//
// Threads: one monitor thread per rank owns the sockets after setup; failure() and departed() may
// be read from any thread (failures are stored under a mutex, published by a release store of a
// flag that both load with acquire first). The destructor stops the thread, then says bye.
#pragma once

#include "control/bootstrap.hpp"
#include "control/peer_watch.hpp"
#include "control/tcp_socket.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::control {

class Liveness final : public PeerWatch {
 public:
  // Collective over `bootstrap` (after its rendezvous; a world of more than one rank). Rank 0
  // listens on `bind_host`; the others connect to `master_addr`. Throws proxyep::Error
  // ("bootstrap.liveness") when a rank does not connect within `timeout`.
  static std::unique_ptr<Liveness> start(Bootstrap& bootstrap, const std::string& bind_host,
                                         const std::string& master_addr,
                                         std::chrono::milliseconds timeout);
  ~Liveness() override;
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  std::optional<PeerFailure> failure() const override;
  bool departed(int rank) const override;

  // One peer connection and what has arrived of its next message.
  struct Peer {
    Peer(int rank, Socket socket) : rank(rank), socket(std::move(socket)) {}
    int rank = -1;  // -1 until its hello named it
    Socket socket;
    std::vector<uint8_t> inbox;
    bool said_bye = false;
  };

 private:
  Liveness(int rank, std::vector<Peer> peers);
  void monitor();
  // Reads what `peer` sent; false once its connection is gone.
  bool drain(Peer& peer);
  void closed(Peer& peer, const std::string& why);
  void record(int rank, const std::string& reason);

  int rank_;
  std::vector<Peer> peers_;  // rank 0: every other rank; others: rank 0
  Socket wake_;              // eventfd: the destructor wakes the monitor with it
  std::thread thread_;
  mutable std::mutex mutex_;
  std::optional<PeerFailure> failure_;
  std::vector<int> departed_;        // every rank recorded, under mutex_
  std::atomic<bool> failed_{false};  // release after failure_ is set, acquire in failure()
};

}  // namespace proxyep::control
