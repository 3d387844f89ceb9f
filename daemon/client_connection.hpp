// One client of the daemon: its socket, its peer credentials, the frames coming in and going
// out, and the deadline of whatever it is doing now. Single-threaded: the daemon's poll loop
// drives it with the events poll_events() asks for.
//
// Stages, each bounded by daemon.io_timeout_ms from its start, so a client that stalls (sends
// half a hello, never reads its answer) is dropped and never holds the daemon:
//   hello     reading the client's hello
//   replying  sending what was queued; once sent, the daemon shuts its side (FIN)
//   closing   reading and dropping whatever the client still sends until it closes, so that
//             closing never discards unread bytes (which would reset the connection and could
//             cost the client the last frame: the error that says why it was refused)
#pragma once

#include "common/deadline.hpp"
#include "control/daemon_frames.hpp"
#include "control/tcp_socket.hpp"
#include "daemon/access_policy.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

namespace proxyep::daemon {

class ClientConnection {
 public:
  enum class Stage { hello, replying, closing, done };
  enum class Read { nothing, message, end_of_stream, bad_frame };

  ClientConnection(control::Socket socket, PeerCredentials peer,
                   std::chrono::milliseconds io_timeout);

  int fd() const { return socket_.fd(); }
  const PeerCredentials& peer() const { return peer_; }
  Stage stage() const { return stage_; }
  bool done() const { return stage_ == Stage::done; }
  const Deadline& deadline() const { return deadline_; }
  // The events poll() should wait for now.
  short poll_events() const;

  // Stage hello: reads what has arrived; `message` gets the first complete frame. On
  // end_of_stream and bad_frame `problem` says what happened (a frame cut short, too large,
  // not JSON).
  Read read_hello(nlohmann::json& message, std::string& problem);
  // Queues a frame and enters stage replying (a fresh deadline); the daemon answers then ends
  // every connection today (status is one-shot, everything else is an error).
  void reply(const nlohmann::json& message);
  // Stages replying and closing: sends what the socket takes, drains what the client sends.
  // Moves to done when the client has read everything and closed, or is gone.
  void pump();
  // Ends the connection now (deadline passed, daemon stopping).
  void drop() noexcept;
  // Hands the socket over (an attach hello: the connection becomes an AttachedClient); the
  // connection is done.
  control::Socket take_socket() {
    stage_ = Stage::done;
    return std::move(socket_);
  }

  // Why the connection ended early, if it did ("" otherwise): for the daemon's log.
  const std::string& problem() const { return problem_; }

 private:
  void send_pending();
  void drain_input();

  control::Socket socket_;
  PeerCredentials peer_;
  std::chrono::milliseconds io_timeout_;
  Deadline deadline_;
  Stage stage_ = Stage::hello;
  control::FrameDecoder decoder_;
  std::string outbox_;
  size_t sent_ = 0;
  std::string problem_;
};

}  // namespace proxyep::daemon
