// The daemon's listening Unix socket, and the rules for taking its path:
//
// - The directory is created when missing (each missing component, mode 0750: the daemon's
//   group may reach the socket, others may not); an existing directory keeps its mode.
// - `<path>.lock` is held with flock() while the socket is served, so two daemons started at
//   once cannot both decide the path is free (the lock file is never removed: removing it would
//   reopen that race). A held lock means another daemon serves the path: Error naming it.
// - A socket file that nobody accepts on (connect: ECONNREFUSED) was left by a daemon that died
//   without cleaning up (SIGKILL, a crash): it is replaced. One that accepts means another
//   daemon (without the lock: an older build) serves it: Error naming the path. Anything that
//   is not a socket is never removed.
// - The socket file gets `mode` before listen(), so nobody connects under the umask's bits.
// close() removes the socket file only while it is still the one this listener bound (same
// device and inode), then releases the lock.
#pragma once

#include "control/tcp_socket.hpp"

#include <sys/types.h>

#include <string>
#include <utility>

namespace proxyep::daemon {

class UnixListener {
 public:
  // Takes `path` as above and listens. Throws proxyep::Error("daemon.socket") naming the path.
  static UnixListener open(const std::string& path, mode_t mode);

  UnixListener() = default;
  UnixListener(UnixListener&& other) noexcept { *this = std::move(other); }
  UnixListener& operator=(UnixListener&&) noexcept;
  ~UnixListener() { close(); }

  int fd() const { return socket_.fd(); }
  bool listening() const { return socket_.valid(); }
  const std::string& path() const { return path_; }

  // Stops listening (connections still in the backlog are reset), removes the socket file if it
  // is still ours, releases the lock. Idempotent; never throws.
  void close() noexcept;

 private:
  control::Socket socket_;
  control::Socket lock_;  // the flock()ed <path>.lock (a file descriptor like any other)
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace proxyep::daemon
