#include "daemon/status_client.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/daemon_connection.hpp"
#include "control/daemon_handshake.hpp"
#include "control/unix_socket.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace proxyep::daemon {
namespace {

constexpr const char* kPhase = "daemon.status";

}  // namespace

StatusAnswer query_status(const std::string& socket_path, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  auto daemon =
      control::DaemonConnection::open(socket_path, control::ClientKind::status, timeout, kPhase);
  StatusAnswer answer;
  answer.welcome = daemon.welcome();
  answer.status = daemon.receive("its status", deadline, kPhase);
  if (control::message_type(answer.status) != "status")
    fail(kPhase, "proxyepd at {} sent a '{}' message where its status was due", socket_path,
         control::message_type(answer.status));
  return answer;
}

}  // namespace proxyep::daemon
