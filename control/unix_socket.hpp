// Unix stream socket helpers shared by the daemon's listener and its clients: the address of a
// path (checked against sun_path's 108 bytes) and one connect attempt bounded by a deadline.
// Sockets are close-on-exec; the connected socket comes back non-blocking.
#pragma once

#include "common/deadline.hpp"
#include "control/tcp_socket.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

namespace proxyep::control {

// sockaddr_un of `path` and its length. Throws proxyep::Error(`phase`) for a path that does
// not fit (at most 107 bytes).
struct UnixAddress {
  sockaddr_un addr{};
  socklen_t len = 0;
};
UnixAddress unix_address(const std::string& path, const std::string& phase);

// One connect to the Unix socket at `path`, waiting at most until `deadline` when the daemon's
// backlog is full. `error` is the errno of a failure (ENOENT: no file; ECONNREFUSED: nobody
// listens, a stale socket; EAGAIN: the deadline passed with the backlog full; EACCES: the
// file's or directory's permissions), 0 on success.
Socket connect_unix(const std::string& path, const Deadline& deadline, int& error);

// The errno of connect_unix in words, for "no proxyepd at PATH: <reason>".
std::string connect_error_text(int error);

}  // namespace proxyep::control
