// Daemon: accepting connections, the peer-credential check and the handshake (daemon.hpp).
#include "common/log.hpp"
#include "daemon/daemon.hpp"
#include "daemon/handshake.hpp"
#include "daemon/status_report.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace proxyep::daemon {
namespace {

// Connections taken per turn of the loop, so a burst does not starve the clients in progress.
constexpr int kAcceptsPerTurn = 64;
// How long accepting pauses when the process is out of file descriptors or memory: the
// listener stays readable, and polling it at once again would spin.
constexpr std::chrono::milliseconds kAcceptPause{100};

}  // namespace

void Daemon::accept_pending() {
  for (int i = 0; i < kAcceptsPerTurn; ++i) {
    if (clients_.size() >= static_cast<size_t>(options_.max_connections)) return;
    const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(control::Socket(fd));
      continue;
    }
    if (errno == ECONNABORTED || errno == EINTR) continue;
    if (errno == EAGAIN) return;
    log::warn("proxyepd: accept on {} failed ({}); pausing accepts for {} ms", options_.socket_path,
              control::errno_text(errno), kAcceptPause.count());
    accept_paused_until_ = Deadline::Clock::now() + kAcceptPause;
    return;
  }
}

void Daemon::admit(control::Socket socket) {
  std::string error;
  const auto peer = peer_credentials(socket.fd(), error);
  if (!peer) {
    stats_->refused.fetch_add(1, std::memory_order_relaxed);
    log::warn("proxyepd: refused a connection: cannot read its credentials (SO_PEERCRED): {}",
              error);
    return;  // closes it
  }
  auto client = std::make_unique<ClientConnection>(std::move(socket), *peer, options_.io_timeout);
  if (const std::string why = options_.access.refusal(*peer); !why.empty()) {
    stats_->refused.fetch_add(1, std::memory_order_relaxed);
    log::warn("proxyepd: refused {}: {}", describe_peer(*peer), why);
    client->reply(error_message(why));
    client->pump();
  }
  clients_.push_back(std::move(client));
}

void Daemon::service(ClientConnection& client, short revents) {
  if (client.stage() == ClientConnection::Stage::hello &&
      (revents & (POLLIN | POLLHUP | POLLERR))) {
    nlohmann::json message;
    std::string problem;
    switch (client.read_hello(message, problem)) {
      case ClientConnection::Read::nothing:
        break;
      case ClientConnection::Read::message:
        on_hello(client, message);
        break;
      case ClientConnection::Read::end_of_stream:
        stats_->bad_handshake.fetch_add(1, std::memory_order_relaxed);
        log::info("proxyepd: {} {}", describe_peer(client.peer()), problem);
        break;
      case ClientConnection::Read::bad_frame:
        stats_->bad_handshake.fetch_add(1, std::memory_order_relaxed);
        log::warn("proxyepd: bad handshake from {}: {}", describe_peer(client.peer()), problem);
        client.reply(error_message(problem));
        break;
    }
  }
  client.pump();
}

void Daemon::on_hello(ClientConnection& client, const nlohmann::json& message) {
  const HelloCheck check = check_hello(message);
  std::string problem = check.problem;
  if (problem.empty()) problem = unsupported_kind(check.hello->kind);
  if (!problem.empty()) {
    stats_->bad_handshake.fetch_add(1, std::memory_order_relaxed);
    log::warn("proxyepd: bad handshake from {}: {}", describe_peer(client.peer()), problem);
    client.reply(error_message(problem));
    return;
  }
  stats_->accepted.fetch_add(1, std::memory_order_relaxed);
  log::debug("proxyepd: status for {}", describe_peer(client.peer()));
  client.reply(welcome_message(stats_->pid));
  client.reply(status_report(*stats_, options_.socket_path, metrics_url()));
}

}  // namespace proxyep::daemon
