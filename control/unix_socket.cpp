#include "control/unix_socket.hpp"

#include "common/error.hpp"

#include <fcntl.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace proxyep::control {

UnixAddress unix_address(const std::string& path, const std::string& phase) {
  UnixAddress a;
  require(!path.empty() && path.size() < sizeof a.addr.sun_path, phase,
          "socket path '{}' must be 1 to {} bytes long (a Unix socket's limit)", path,
          sizeof a.addr.sun_path - 1);
  a.addr.sun_family = AF_UNIX;
  std::memcpy(a.addr.sun_path, path.data(), path.size());
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

Socket connect_unix(const std::string& path, const Deadline& deadline, int& error) {
  const UnixAddress a = unix_address(path, "daemon.connect");
  Socket socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) {
    error = errno;
    return {};
  }
  // A blocking connect on a Unix socket waits only while the listener's backlog is full, and
  // SO_SNDTIMEO bounds that wait (it then fails with EAGAIN); otherwise it succeeds or fails
  // at once. At least 1 ms: a zero timeout would mean "wait forever".
  const auto left = std::max<int64_t>(deadline.remaining().count(), 1);
  timeval timeout{static_cast<time_t>(left / 1000), static_cast<suseconds_t>(left % 1000 * 1000)};
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0) {
    error = errno == EINPROGRESS ? EAGAIN : errno;
    return {};
  }
  const int flags = ::fcntl(socket.fd(), F_GETFL);
  if (flags < 0 || ::fcntl(socket.fd(), F_SETFL, flags | O_NONBLOCK) != 0) {
    error = errno;
    return {};
  }
  error = 0;
  return socket;
}

std::string connect_error_text(int error) {
  switch (error) {
    case ENOENT:
      return "no such file (is proxyepd running, and on this socket?)";
    case ECONNREFUSED:
      return "connection refused (a stale socket: the daemon that made it is gone)";
    case EAGAIN:
      return "timed out waiting in the daemon's backlog";
    default:
      return control::errno_text(error);
  }
}

}  // namespace proxyep::control
