#include "control/framed_connection.hpp"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace proxyep::control {
namespace {

constexpr size_t kReadChunk = 64 * 1024;

}  // namespace

FramedConnection::FramedConnection(Socket socket, std::string peer)
    : socket_(std::move(socket)), peer_(std::move(peer)) {}

void FramedConnection::queue(const wire::Header& header, std::span<const uint8_t> payload) {
  if (sent_ == outbox_.size()) {
    outbox_.clear();
    sent_ = 0;
  }
  auto frame = wire::encode_frame(header, payload);
  outbox_.insert(outbox_.end(), frame.begin(), frame.end());
}

bool FramedConnection::flush() {
  while (!closed_ && wants_write()) {
    // MSG_NOSIGNAL: a vanished peer must surface as an error naming it, not kill us by SIGPIPE.
    ssize_t n = ::send(socket_.fd(), outbox_.data() + sent_, outbox_.size() - sent_,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent_ += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else {
      mark_closed(errno_text(errno));
    }
  }
  if (!wants_write()) {
    outbox_.clear();
    sent_ = 0;
  }
  return !closed_;
}

void FramedConnection::receive() {
  while (!closed_) {
    // Enough for one whole frame is waiting: leave the rest in the socket until it is popped.
    if (inbox_.size() - consumed_ > wire::kHeaderBytes + max_payload_) return;
    size_t old_size = inbox_.size();
    inbox_.resize(old_size + kReadChunk);
    ssize_t n = ::recv(socket_.fd(), inbox_.data() + old_size, kReadChunk, MSG_DONTWAIT);
    inbox_.resize(old_size + static_cast<size_t>(n > 0 ? n : 0));
    if (n > 0) continue;
    if (n == 0) {
      mark_closed("end of stream");
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      mark_closed(errno_text(errno));
    }
    return;
  }
}

std::optional<wire::Frame> FramedConnection::pop_frame() {
  std::span<const uint8_t> pending(inbox_.data() + consumed_, inbox_.size() - consumed_);
  if (pending.size() < wire::kHeaderBytes) return std::nullopt;
  wire::Header header = wire::decode_header(pending);
  if (header.length > max_payload_)
    throw wire::BadFrame(
        fmt::format("a '{}' frame of {} bytes exceeds this connection's limit of {}",
                    wire::to_string(header.kind), header.length, max_payload_));
  if (pending.size() < wire::kHeaderBytes + header.length) return std::nullopt;
  wire::Frame frame{header, {}};
  auto payload = pending.subspan(wire::kHeaderBytes, header.length);
  frame.payload.assign(payload.begin(), payload.end());
  consumed_ += wire::kHeaderBytes + header.length;
  // Drop consumed bytes once they dominate, so a long-lived inbox does not grow without bound.
  if (consumed_ == inbox_.size() || consumed_ > kReadChunk) {
    inbox_.erase(inbox_.begin(), inbox_.begin() + static_cast<std::ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  return frame;
}

void FramedConnection::close() noexcept {
  socket_.close();
  if (!closed_) mark_closed("closed locally");
}

void FramedConnection::discard_inbox() {
  inbox_.clear();
  consumed_ = 0;
}

void FramedConnection::shutdown_write() noexcept {
  if (socket_.valid()) ::shutdown(socket_.fd(), SHUT_WR);
}

void FramedConnection::mark_closed(std::string reason) {
  closed_ = true;
  close_reason_ = std::move(reason);
}

void close_gracefully(std::span<FramedConnection* const> connections,
                      std::chrono::milliseconds linger) noexcept {
  try {
    Deadline deadline(linger);
    std::vector<pollfd> fds;
    auto wait_for = [&](short events, auto&& wanted) {
      while (!deadline.expired()) {
        fds.clear();
        std::vector<FramedConnection*> waiting;
        for (auto* connection : connections) {
          if (connection != nullptr && !connection->closed() && wanted(*connection)) {
            fds.push_back({connection->fd(), events, 0});
            waiting.push_back(connection);
          }
        }
        if (fds.empty()) return;
        int wait = static_cast<int>(std::min(deadline.remaining(), kPollSlice).count());
        if (::poll(fds.data(), fds.size(), wait) <= 0) continue;
        for (size_t i = 0; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          if (events == POLLOUT) {
            waiting[i]->flush();
          } else {
            waiting[i]->receive();
            waiting[i]->discard_inbox();
          }
        }
      }
    };
    wait_for(POLLOUT, [](FramedConnection& c) { return c.flush() && c.wants_write(); });
    for (auto* connection : connections)
      if (connection != nullptr) connection->shutdown_write();
    wait_for(POLLIN, [](FramedConnection&) { return true; });
  } catch (...) {
    // Best effort: whatever failed, the connections are closed below.
  }
  for (auto* connection : connections)
    if (connection != nullptr) connection->close();
}

}  // namespace proxyep::control
