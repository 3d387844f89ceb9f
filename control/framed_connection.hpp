// One bootstrap TCP connection with an inbox and an outbox of frames (control/bootstrap_wire.hpp).
// The socket is non-blocking: receive() takes whatever has arrived, flush() sends whatever the
// kernel accepts, and the owner's poll loop decides when to call them. Frames queue up in order;
// bytes of a frame that arrived early (a peer already in the next collective) stay in the inbox
// for the next call. Single-threaded: one owner drives it.
#pragma once

#include "control/bootstrap_wire.hpp"
#include "control/tcp_socket.hpp"

#include <optional>
#include <span>
#include <string>

namespace proxyep::control {

class FramedConnection {
 public:
  FramedConnection(Socket socket, std::string peer);

  int fd() const { return socket_.fd(); }
  const std::string& peer() const { return peer_; }  // "127.0.0.1:41234"

  // The largest payload this connection accepts: a longer frame is a BadFrame, and receive()
  // stops buffering once a whole frame of this size is waiting (strangers get little memory).
  void limit_payload(uint32_t bytes) { max_payload_ = bytes; }

  void queue(const wire::Header& header, std::span<const uint8_t> payload);
  bool wants_write() const { return sent_ < outbox_.size(); }
  // Sends what the socket takes now. Returns false (and marks the connection closed) when the
  // peer is gone.
  bool flush();
  // Reads everything available now. EOF or a reset marks the connection closed; frames that
  // arrived before it can still be popped.
  void receive();
  // The next complete frame, if one has arrived. Throws wire::BadFrame on a malformed header or
  // a payload over the limit.
  std::optional<wire::Frame> pop_frame();
  void discard_inbox();

  bool closed() const { return closed_; }
  const std::string& close_reason() const { return close_reason_; }  // "end of stream", errno text

  void close() noexcept;
  // Sends FIN after the bytes already written (the peer reads them, then end of stream).
  void shutdown_write() noexcept;

 private:
  void mark_closed(std::string reason);

  Socket socket_;
  std::string peer_;
  wire::Bytes inbox_;
  size_t consumed_ = 0;  // inbox_ bytes already popped as frames
  uint32_t max_payload_ = wire::kMaxPayloadBytes;
  wire::Bytes outbox_;
  size_t sent_ = 0;  // outbox_ bytes already written to the socket
  bool closed_ = false;
  std::string close_reason_;
};

// Orderly close of several connections at once, bounded by `linger` in all: flush what is
// queued (typically an abort frame), send FIN, then read and drop whatever the peers still send
// until they close. Closing with unread bytes would send a reset instead, and a reset can destroy
// the last frame before the peer reads it.
void close_gracefully(std::span<FramedConnection* const> connections,
                      std::chrono::milliseconds linger) noexcept;

}  // namespace proxyep::control
