// TCP socket helpers for the bootstrap and the local launcher: an RAII file descriptor,
// listening, one bounded non-blocking connect attempt, and a poll() slice that drives the
// caller's progress hook. Every socket is non-blocking and close-on-exec; every wait here is cut
// into slices of at most kPollSlice so the progress hook keeps running (manual-progress fabric
// providers stall when nobody reads their completion queue).
#pragma once

#include "common/deadline.hpp"

#include <poll.h>

#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace proxyep::control {

using ProgressFn = std::function<void()>;

// Longest single poll() while waiting; the progress hook runs after every slice.
constexpr std::chrono::milliseconds kPollSlice{10};
// With a progress hook installed, poll in shorter slices so the fabric is progressed often.
constexpr std::chrono::milliseconds kPollSliceWithProgress{1};

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close() noexcept;

 private:
  int fd_ = -1;
};

std::string errno_text(int error);
// "host:port" of the socket's peer / local end, for messages ("?" when unknown).
std::string peer_name(int fd);
int local_port(int fd);

// Binds host:port (SO_REUSEADDR) and listens. Returns an invalid socket and sets `error` (and
// `error_code` to the errno) on failure.
Socket listen_tcp(const std::string& host, int port, int backlog, std::string& error,
                  int& error_code);
// Accepts one pending connection (non-blocking); invalid socket when none is waiting.
Socket accept_one(const Socket& listener);

// One attempt to connect to host:port (every resolved address in turn), waiting in poll slices
// until `deadline`. Returns the connected socket, or nullopt with `error` saying why.
std::optional<Socket> connect_once(const std::string& host, int port, const Deadline& deadline,
                                   const ProgressFn& progress, std::string& error);

// A loopback port that was free a moment ago (bind 127.0.0.1:0, read it, close). Races with
// other processes are possible but rare; rank 0's bind retries briefly on EADDRINUSE.
int find_free_loopback_port();

// One poll() of at most the slice (never past `deadline`), then the progress hook. EINTR counts
// as an empty slice. Throws proxyep::Error(phase) if poll() itself fails.
void poll_slice(std::span<pollfd> fds, const Deadline& deadline, const ProgressFn& progress,
                const std::string& phase);
// Sleeps until `until` (or the deadline) in slices, driving progress.
void sleep_slices(std::chrono::milliseconds duration, const Deadline& deadline,
                  const ProgressFn& progress, const std::string& phase);

}  // namespace proxyep::control
