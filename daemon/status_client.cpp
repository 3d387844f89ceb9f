#include "daemon/status_client.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "daemon/frame_codec.hpp"
#include "daemon/handshake.hpp"
#include "daemon/unix_socket.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace proxyep::daemon {
namespace {

constexpr const char* kPhase = "daemon.status";

class Exchange {
 public:
  Exchange(const std::string& path, std::chrono::milliseconds timeout)
      : path_(path), timeout_(timeout), deadline_(timeout) {}

  void connect() {
    int error = 0;
    socket_ = connect_unix(path_, deadline_, error);
    if (error != 0) fail(kPhase, "no proxyepd at {}: {}", path_, connect_error_text(error));
  }

  // Sends `frame` whole. A daemon that refused this client may already have closed: the send
  // then fails, but its error frame is still waiting to be read, so that is not an error here.
  void send(const std::string& frame) {
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n =
          ::send(socket_.fd(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        wait(POLLOUT, "take the hello");
      } else {
        return;
      }
    }
  }

  // The next frame; an error frame from the daemon becomes an Error quoting it.
  nlohmann::json receive(const char* what) {
    for (;;) {
      nlohmann::json message;
      std::string problem;
      switch (decoder_.next(message, problem)) {
        case FrameDecoder::Result::frame:
          if (message_type(message) == "error")
            fail(kPhase, "proxyepd at {} refused this client: {}", path_,
                 message.value("error", std::string("(no reason given)")));
          return message;
        case FrameDecoder::Result::error:
          fail(kPhase, "proxyepd at {} sent a bad frame: {}", path_, problem);
        case FrameDecoder::Result::need_more:
          break;
      }
      const ssize_t n = ::recv(socket_.fd(), buffer_.data(), buffer_.size(), 0);
      if (n > 0) {
        decoder_.feed({buffer_.data(), static_cast<size_t>(n)});
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        wait(POLLIN, std::string("send ") + what);
      } else {
        fail(kPhase, "proxyepd at {} closed the connection before sending {} ({})", path_, what,
             n == 0 ? std::string("end of stream") : control::errno_text(errno));
      }
    }
  }

 private:
  void wait(short events, const std::string& what) {
    pollfd fd{socket_.fd(), events, 0};
    const auto left = deadline_.remaining().count();
    const int rc = left > 0 ? ::poll(&fd, 1, static_cast<int>(left)) : 0;
    if (rc < 0 && errno != EINTR) fail(kPhase, "poll: {}", control::errno_text(errno));
    if (rc == 0 && deadline_.expired())
      fail(kPhase, "proxyepd at {} did not {} within {} ms", path_, what, timeout_.count());
  }

  std::string path_;
  std::chrono::milliseconds timeout_;
  Deadline deadline_;
  control::Socket socket_;
  FrameDecoder decoder_;
  std::vector<char> buffer_ = std::vector<char>(64 * 1024);
};

}  // namespace

StatusAnswer query_status(const std::string& socket_path, std::chrono::milliseconds timeout) {
  Exchange exchange(socket_path, timeout);
  exchange.connect();
  Hello hello;
  hello.kind = ClientKind::status;
  hello.pid = ::getpid();
  hello.capabilities = daemon_capabilities();
  exchange.send(encode_frame(hello_message(hello)));
  StatusAnswer answer;
  answer.welcome = exchange.receive("its welcome");
  if (message_type(answer.welcome) != "welcome")
    fail(kPhase, "proxyepd at {} answered the hello with a '{}' message, not a welcome",
         socket_path, message_type(answer.welcome));
  answer.status = exchange.receive("its status");
  if (message_type(answer.status) != "status")
    fail(kPhase, "proxyepd at {} sent a '{}' message where its status was due", socket_path,
         message_type(answer.status));
  return answer;
}

}  // namespace proxyep::daemon
