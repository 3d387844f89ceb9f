#include "control/daemon_connection.hpp"

#include "common/error.hpp"
#include "control/fd_passing.hpp"
#include "control/unix_socket.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace proxyep::control {

std::string daemon_failure_text(const nlohmann::json& message) {
  const std::string type = message_type(message);
  if (type == "error") return message.value("error", std::string("(no reason given)"));
  if (type == "failure")
    return fmt::format("{}: {}", message.value("phase", std::string("proxy")),
                       message.value("message", std::string("(no reason given)")));
  return fmt::format("an unexpected '{}' message", type);
}

DaemonConnection DaemonConnection::open(const std::string& path, ClientKind kind,
                                        std::chrono::milliseconds timeout, std::string_view phase) {
  const Deadline deadline(timeout);
  int error = 0;
  Socket socket = connect_unix(path, deadline, error);
  if (error != 0)
    fail(std::string(phase), "no proxyepd at {}: {}", path, connect_error_text(error));
  DaemonConnection connection(path, std::move(socket), timeout);
  Hello hello;
  hello.kind = kind;
  hello.pid = ::getpid();
  hello.capabilities = daemon_capabilities();
  connection.send(hello_message(hello), {}, deadline, phase);
  connection.welcome_ = connection.receive("its welcome", deadline, phase);
  if (message_type(connection.welcome_) != "welcome")
    fail(std::string(phase), "proxyepd at {} answered the hello with a '{}' message, not a welcome",
         path, message_type(connection.welcome_));
  return connection;
}

void DaemonConnection::send(const nlohmann::json& message, std::span<const int> fds,
                            const Deadline& deadline, std::string_view phase) {
  const std::string frame = encode_frame(message);
  size_t sent = 0;
  while (sent < frame.size()) {
    const std::span<const char> rest(frame.data() + sent, frame.size() - sent);
    const ssize_t n = sent == 0 ? send_with_fds(socket_.fd(), rest, fds)
                                : ::send(socket_.fd(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      wait(POLLOUT, "take a request", deadline, phase);
    } else {
      return;  // the daemon closed: receive() says why
    }
  }
}

ssize_t DaemonConnection::read_some() {
  const ssize_t n = ::recv(socket_.fd(), buffer_.data(), buffer_.size(), 0);
  if (n > 0) decoder_.feed({buffer_.data(), static_cast<size_t>(n)});
  if (n < 0 && errno != EAGAIN && errno != EINTR) return 0;  // a reset ends the stream too
  return n;
}

nlohmann::json DaemonConnection::receive(std::string_view what, const Deadline& deadline,
                                         std::string_view phase) {
  for (;;) {
    nlohmann::json message;
    std::string problem;
    switch (decoder_.next(message, problem)) {
      case FrameDecoder::Result::frame:
        if (message_type(message) == "error" || message_type(message) == "failure")
          fail(std::string(phase), "proxyepd at {} refused this client: {}", path_,
               daemon_failure_text(message));
        return message;
      case FrameDecoder::Result::error: {
        // Braced: clang 14 miscompiles a case that falls from a throwing call with a temporary
        // into the next label (it runs the temporary's destructor on the jump to need_more).
        fail(std::string(phase), "proxyepd at {} sent a bad frame: {}", path_, problem);
      }
      case FrameDecoder::Result::need_more:
        break;
    }
    const ssize_t n = read_some();
    if (n == 0)
      fail(std::string(phase),
           "proxyepd at {} closed the connection before sending {} (did the daemon exit?)", path_,
           what);
    if (n < 0) wait(POLLIN, fmt::format("send {}", what), deadline, phase);
  }
}

nlohmann::json DaemonConnection::request(const nlohmann::json& message, std::span<const int> fds,
                                         std::string_view expect, const Deadline& deadline,
                                         std::string_view phase) {
  send(message, fds, deadline, phase);
  nlohmann::json reply =
      receive(fmt::format("its answer to '{}'", message_type(message)), deadline, phase);
  if (message_type(reply) != expect)
    fail(std::string(phase), "proxyepd at {} answered '{}' with a '{}' message, not '{}'", path_,
         message_type(message), message_type(reply), expect);
  return reply;
}

std::optional<std::string> DaemonConnection::poll_failure(
    const std::function<bool(const nlohmann::json&)>& take) {
  if (failure_) return failure_;
  for (;;) {
    nlohmann::json message;
    std::string problem;
    const auto result = decoder_.next(message, problem);
    if (result == FrameDecoder::Result::frame) {
      if (take && take(message)) continue;
      failure_ = fmt::format("proxyepd at {}: {}", path_, daemon_failure_text(message));
      return failure_;
    }
    if (result == FrameDecoder::Result::error) {
      failure_ = fmt::format("proxyepd at {} sent a bad frame: {}", path_, problem);
      return failure_;
    }
    const ssize_t n = read_some();
    if (n == 0) {
      failure_ = fmt::format("proxyepd at {} closed the connection (the daemon exited?)", path_);
      return failure_;
    }
    if (n < 0) return std::nullopt;
  }
}

void DaemonConnection::wait(short events, std::string_view what, const Deadline& deadline,
                            std::string_view phase) {
  pollfd fd{socket_.fd(), events, 0};
  const auto left = deadline.remaining().count();
  const int rc = left > 0 ? ::poll(&fd, 1, static_cast<int>(left)) : 0;
  if (rc < 0 && errno != EINTR) fail(std::string(phase), "poll: {}", errno_text(errno));
  if (rc == 0 && deadline.expired())
    fail(std::string(phase), "proxyepd at {} did not {} within {} ms", path_, what,
         timeout_.count());
}

}  // namespace proxyep::control
