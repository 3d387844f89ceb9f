// Test helper: a hand-driven bootstrap peer (a stranger, an old build, an impostor rank 0) that
// writes exactly the frames a test gives it and reads whatever comes back, with deadlines.
#pragma once

#include "common/deadline.hpp"
#include "control/bootstrap_wire.hpp"
#include "control/tcp_socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>

namespace proxyep::control::testing {

class RawPeer {
 public:
  // Connects to 127.0.0.1:port, retrying until `patience` runs out (rank 0 may not listen yet).
  static RawPeer connect(int port, std::chrono::milliseconds patience = std::chrono::seconds(10)) {
    Deadline deadline(patience);
    while (!deadline.expired()) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return RawPeer(fd);
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    throw std::runtime_error("RawPeer: nobody listened on the port in time");
  }
  // Takes an accepted connection (an impostor rank 0).
  explicit RawPeer(int fd) : fd_(fd) {}
  RawPeer(RawPeer&& other) noexcept : fd_(other.fd_), inbox_(std::move(other.inbox_)) {
    other.fd_ = -1;
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }

  void send_raw(std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;  // the other side closed: what it said before still counts
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  }
  void send(const wire::Header& header, std::span<const uint8_t> payload) {
    send_raw(wire::encode_frame(header, payload));
  }

  // The next whole frame, or nullopt on end of stream or when `wait` runs out.
  std::optional<wire::Frame> read(std::chrono::milliseconds wait) {
    Deadline deadline(wait);
    while (true) {
      if (inbox_.size() >= wire::kHeaderBytes) {
        auto header = wire::decode_header(inbox_);
        if (inbox_.size() >= wire::kHeaderBytes + header.length) {
          wire::Frame frame{header,
                            wire::Bytes(inbox_.begin() + wire::kHeaderBytes,
                                        inbox_.begin() + wire::kHeaderBytes + header.length)};
          inbox_.erase(inbox_.begin(), inbox_.begin() + wire::kHeaderBytes + header.length);
          return frame;
        }
      }
      if (deadline.expired()) return std::nullopt;
      pollfd pfd{fd_, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 50)));
      if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      uint8_t buffer[4096];
      ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        if (inbox_.size() < wire::kHeaderBytes) return std::nullopt;
        auto header = wire::decode_header(inbox_);
        if (inbox_.size() < wire::kHeaderBytes + header.length) return std::nullopt;
        continue;
      }
      inbox_.insert(inbox_.end(), buffer, buffer + n);
    }
  }
  // Reads frames until one of `kind` arrives (nullopt: the stream ended or time ran out).
  std::optional<wire::Frame> read_until(wire::Kind kind, std::chrono::milliseconds wait) {
    Deadline deadline(wait);
    while (auto frame = read(deadline.remaining())) {
      if (frame->header.kind == kind) return frame;
    }
    return std::nullopt;
  }

 private:
  int fd_ = -1;
  wire::Bytes inbox_;
};

}  // namespace proxyep::control::testing
