#include "control/tcp_socket.hpp"

#include "common/error.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

namespace proxyep::control {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoList resolve(const std::string& host, int port, bool passive, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    error = fmt::format("cannot resolve '{}': {}", host,
                        rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return nullptr;
  }
  return AddrInfoList(found);
}

std::string sockaddr_text(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (addr->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

// Small request/response messages: send them now rather than wait for more (Nagle).
void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Connecting to a local port nobody listens on can, rarely, pick that very port as the
// ephemeral source and connect the socket to itself (TCP simultaneous open). Such a socket
// would then read its own hello back; treat it as a refused attempt.
bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  return local_len == peer_len && std::memcmp(&local, &peer, local_len) == 0;
}

// Waits for a non-blocking connect to finish; returns the errno it finished with (ETIMEDOUT
// when the deadline passed first).
int finish_connect(int fd, const Deadline& deadline, const ProgressFn& progress) {
  while (!deadline.expired()) {
    pollfd pfd{fd, POLLOUT, 0};
    poll_slice(std::span(&pfd, 1), deadline, progress, "bootstrap.rendezvous");
    if (pfd.revents == 0) continue;
    int error = 0;
    socklen_t len = sizeof error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return errno;
    return error;
  }
  return ETIMEDOUT;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r returns the message pointer (which may or may not be `buffer`).
  return strerror_r(error, buffer, sizeof buffer);
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return sockaddr_text(reinterpret_cast<const sockaddr*>(&addr));
}

int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

Socket listen_tcp(const std::string& host, int port, int backlog, std::string& error,
                  int& error_code) {
  auto list = resolve(host, port, true, error);
  error_code = 0;
  if (!list) return Socket();
  for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock.valid()) {
      error_code = errno;
      error = fmt::format("socket(): {}", errno_text(errno));
      continue;
    }
    // A previous run's connections in TIME_WAIT must not block the well-known MASTER_PORT.
    int one = 1;
    setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(sock.fd(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(sock.fd(), std::max(backlog, 16)) != 0) {
      error_code = errno;
      error = fmt::format("cannot listen on {}: {}", sockaddr_text(ai->ai_addr), errno_text(errno));
      continue;
    }
    return sock;
  }
  return Socket();
}

Socket accept_one(const Socket& listener) {
  int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) set_nodelay(fd);
  return Socket(fd);
}

std::optional<Socket> connect_once(const std::string& host, int port, const Deadline& deadline,
                                   const ProgressFn& progress, std::string& error) {
  auto list = resolve(host, port, false, error);
  if (!list) return std::nullopt;
  for (addrinfo* ai = list.get(); ai != nullptr && !deadline.expired(); ai = ai->ai_next) {
    Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock.valid()) {
      error = fmt::format("socket(): {}", errno_text(errno));
      continue;
    }
    int rc = ::connect(sock.fd(), ai->ai_addr, ai->ai_addrlen);
    int result = rc == 0 ? 0 : errno;
    if (result == EINPROGRESS) result = finish_connect(sock.fd(), deadline, progress);
    if (result == 0 && connected_to_itself(sock.fd())) result = ECONNREFUSED;
    if (result == 0) {
      set_nodelay(sock.fd());
      return sock;
    }
    // Cut short by our own deadline: an earlier attempt's error (say, refused) says more.
    if (result == ETIMEDOUT && deadline.expired() && !error.empty()) break;
    error = fmt::format("connect to {}: {}", sockaddr_text(ai->ai_addr), errno_text(result));
  }
  return std::nullopt;
}

int find_free_loopback_port() {
  Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  require(sock.valid(), "launch", "socket(): {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  require(::bind(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "launch",
          "cannot bind a free port on 127.0.0.1: {}", errno_text(errno));
  int port = local_port(sock.fd());
  require(port > 0, "launch", "cannot read the bound port: {}", errno_text(errno));
  return port;
}

void poll_slice(std::span<pollfd> fds, const Deadline& deadline, const ProgressFn& progress,
                const std::string& phase) {
  auto slice = progress ? kPollSliceWithProgress : kPollSlice;
  auto wait = std::min(slice, deadline.remaining());
  for (auto& pfd : fds)
    pfd.revents = 0;
  int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (rc < 0 && errno != EINTR) fail(phase, "poll(): {}", errno_text(errno));
  if (progress) progress();
}

void sleep_slices(std::chrono::milliseconds duration, const Deadline& deadline,
                  const ProgressFn& progress, const std::string& phase) {
  Deadline until(std::min(duration, deadline.remaining()));
  while (!until.expired())
    poll_slice(std::span<pollfd>(), until, progress, phase);
}

}  // namespace proxyep::control
