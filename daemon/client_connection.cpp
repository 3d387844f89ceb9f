#include "daemon/client_connection.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>

namespace proxyep::daemon {
namespace {

// One recv() of at most this much per readable event: a hello is a few hundred bytes, and the
// frame limit (1 MiB) arrives over some turns of the loop without starving other clients. On
// the stack, so small (a 64 KiB frame also upset ASan's fake stacks once, in the status client).
constexpr size_t kReadChunk = 16 * 1024;

}  // namespace

ClientConnection::ClientConnection(control::Socket socket, PeerCredentials peer,
                                   std::chrono::milliseconds io_timeout)
    : socket_(std::move(socket)), peer_(peer), io_timeout_(io_timeout), deadline_(io_timeout) {}

short ClientConnection::poll_events() const {
  switch (stage_) {
    case Stage::hello:
      return POLLIN;
    case Stage::replying:
      return sent_ < outbox_.size() ? POLLOUT : 0;
    case Stage::closing:
      return POLLIN;
    case Stage::done:
      return 0;
  }
  return 0;
}

ClientConnection::Read ClientConnection::read_hello(nlohmann::json& message, std::string& problem) {
  std::array<char, kReadChunk> buffer;
  const ssize_t n = ::recv(socket_.fd(), buffer.data(), buffer.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Read::nothing;
  if (n <= 0) {
    problem = n == 0
                  ? (decoder_.mid_frame() ? "closed the connection in the middle of a frame (" +
                                                decoder_.partial_text() + ")"
                                          : std::string("closed the connection before its hello"))
                  : "connection failed: " + control::errno_text(errno);
    problem_ = problem;
    drop();
    return Read::end_of_stream;
  }
  decoder_.feed({buffer.data(), static_cast<size_t>(n)});
  switch (decoder_.next(message, problem)) {
    case control::FrameDecoder::Result::need_more:
      return Read::nothing;
    case control::FrameDecoder::Result::frame:
      return Read::message;
    case control::FrameDecoder::Result::error:
      problem_ = problem;
      return Read::bad_frame;
  }
  return Read::nothing;
}

void ClientConnection::reply(const nlohmann::json& message) {
  outbox_ += control::encode_frame(message);
  if (stage_ == Stage::hello) {
    stage_ = Stage::replying;
    deadline_ = Deadline(io_timeout_);
  }
}

void ClientConnection::pump() {
  if (stage_ == Stage::replying) send_pending();
  if (stage_ == Stage::closing) drain_input();
}

void ClientConnection::send_pending() {
  while (sent_ < outbox_.size()) {
    const ssize_t n =
        ::send(socket_.fd(), outbox_.data() + sent_, outbox_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      problem_ = "the client went away before reading the answer (" +
                 control::errno_text(n < 0 ? errno : EPIPE) + ")";
      drop();
      return;
    }
    sent_ += static_cast<size_t>(n);
  }
  // Everything is out: FIN, then wait for the client's own close (stage closing, fresh
  // deadline).
  ::shutdown(socket_.fd(), SHUT_WR);
  stage_ = Stage::closing;
  deadline_ = Deadline(io_timeout_);
}

void ClientConnection::drain_input() {
  // A few reads per turn: a client that keeps sending cannot keep the loop here.
  constexpr int kReadsPerTurn = 16;
  std::array<char, kReadChunk> buffer;
  for (int i = 0; i < kReadsPerTurn; ++i) {
    const ssize_t n = ::recv(socket_.fd(), buffer.data(), buffer.size(), 0);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    drop();  // end of stream (the client closed) or an error: either way it is over
    return;
  }
}

void ClientConnection::drop() noexcept {
  socket_.close();
  stage_ = Stage::done;
}

}  // namespace proxyep::daemon
