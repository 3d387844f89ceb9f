// A client's connection to the node daemon (proxyepd): connect, hello, then request/reply
// frames (control/daemon_frames.hpp), descriptors passed along where a request needs them
// (control/fd_passing.hpp). Used by `proxyep status` and by a session whose proxy is the daemon
// (proxy/session/proxy_host_daemon.hpp). Every wait has a deadline; errors name the socket.
//
//   auto daemon = DaemonConnection::open(path, ClientKind::attach, timeout, phase);
//   json reply = daemon.request({{"proxyep", "attach"}, ...}, fds, Deadline(timeout), phase);
//   if (auto why = daemon.poll_failure()) ...;   // while attached, between waits
#pragma once

#include "common/deadline.hpp"
#include "control/daemon_frames.hpp"
#include "control/daemon_handshake.hpp"
#include "control/tcp_socket.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::control {

class DaemonConnection {
 public:
  // Connects to the daemon at `path` and says hello as `kind`; the welcome is welcome().
  // Throws proxyep::Error(phase): no daemon there (and why: no file, nobody listening, access
  // denied), the daemon's refusal (quoted), another protocol version, or the deadline.
  // `timeout` bounds the connect and the welcome; later waits have their own deadlines, and a
  // timeout message names this one ("did not send its welcome within 500 ms").
  static DaemonConnection open(const std::string& path, ClientKind kind,
                               std::chrono::milliseconds timeout, std::string_view phase);
  DaemonConnection(DaemonConnection&&) = default;
  DaemonConnection& operator=(DaemonConnection&&) = default;

  const nlohmann::json& welcome() const { return welcome_; }
  const std::string& path() const { return path_; }
  int fd() const { return socket_.fd(); }

  // Sends one frame (with `fds` on its first byte). A daemon that refused this client may
  // already have closed: that is not an error here, the next receive() reports its reason.
  void send(const nlohmann::json& message, std::span<const int> fds, const Deadline& deadline,
            std::string_view phase);
  // The next frame. The daemon's {"proxyep":"error"} becomes proxyep::Error(phase) quoting it;
  // so does an end of stream, a bad frame or the deadline. `what` names the awaited answer.
  nlohmann::json receive(std::string_view what, const Deadline& deadline, std::string_view phase);
  // send() then receive() whose type must be `expect`.
  nlohmann::json request(const nlohmann::json& message, std::span<const int> fds,
                         std::string_view expect, const Deadline& deadline, std::string_view phase);
  // Without waiting: reads what the daemon sent. Each frame goes to `take` first, which
  // returns true for a notice it handled (e.g. a peer given up); any other frame (error,
  // failure), a bad frame or the end of the stream (the daemon exited) is why the daemon no
  // longer serves this client: returned, and returned again by every later call. nullopt while
  // all is well.
  std::optional<std::string> poll_failure(
      const std::function<bool(const nlohmann::json&)>& take = {});

 private:
  DaemonConnection(std::string path, Socket socket, std::chrono::milliseconds timeout)
      : path_(std::move(path)), socket_(std::move(socket)), timeout_(timeout) {}
  void wait(short events, std::string_view what, const Deadline& deadline, std::string_view phase);
  // Reads what arrived into the decoder: >0 bytes, 0 end of stream, -1 nothing now (errno).
  ssize_t read_some();

  std::string path_;
  Socket socket_;
  std::chrono::milliseconds timeout_;
  FrameDecoder decoder_;
  std::vector<char> buffer_ = std::vector<char>(64 * 1024);
  nlohmann::json welcome_;
  std::optional<std::string> failure_;  // sticky once poll_failure() found one
};

// The text of a frame the daemon sends when it stops serving a client ("failure" or "error").
std::string daemon_failure_text(const nlohmann::json& message);

}  // namespace proxyep::control
