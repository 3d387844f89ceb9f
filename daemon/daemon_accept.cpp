// Daemon: accepting connections, the peer-credential check and the handshake (daemon.hpp).
#include "common/log.hpp"
#include "control/daemon_handshake.hpp"
#include "daemon/daemon.hpp"
#include "daemon/status_report.hpp"

#include <fmt/format.h>

#include <algorithm>

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
    client->reply(control::error_message(why));
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
        client.reply(control::error_message(problem));
        break;
    }
  }
  client.pump();
}

void Daemon::on_hello(ClientConnection& client, const nlohmann::json& message) {
  const control::HelloCheck check = control::check_hello(message);
  if (!check.problem.empty()) {
    stats_->bad_handshake.fetch_add(1, std::memory_order_relaxed);
    log::warn("proxyepd: bad handshake from {}: {}", describe_peer(client.peer()), check.problem);
    client.reply(control::error_message(check.problem));
    return;
  }
  if (check.hello->kind == control::ClientKind::attach) {
    if (stats_->draining.load(std::memory_order_relaxed)) {
      client.reply(control::error_message("proxyepd is shutting down: it takes no new clients"));
      return;
    }
    stats_->accepted.fetch_add(1, std::memory_order_relaxed);
    log::info("proxyepd: {} attaches", describe_peer(client.peer()));
    auto attached = std::make_unique<AttachedClient>(
        client.take_socket(), client.peer(),
        [this](const AttachedClient& who, const std::vector<fabric::Bytes>& group) {
          return check_group(who, group);
        });
    attached->send(control::welcome_message(stats_->pid));
    attached_.push_back(std::move(attached));
    return;
  }
  stats_->accepted.fetch_add(1, std::memory_order_relaxed);
  log::debug("proxyepd: status for {}", describe_peer(client.peer()));
  client.reply(control::welcome_message(stats_->pid));
  client.reply(status_report(*stats_, options_.socket_path, metrics_url()));
}

std::string Daemon::check_group(const AttachedClient& client,
                                const std::vector<fabric::Bytes>& group) {
  // A job's ranks are bound to it from their attach on, by the job's tag (an HMAC under its
  // secret, control/job_credentials.hpp), which a client of another job cannot compute:
  // - this client names another client's endpoint: that client must have the same tag (else
  //   this one is refused);
  // - another client named this one's endpoint when it connected: it must have the same tag
  //   (else it is the intruder: it is ended, and this one, the endpoint's owner, goes on; so
  //   whoever connects first, a job's rank cannot be taken from it);
  // - same tag: one job, so the lists must be the same.
  // Jobs without a secret (both tags empty) can be told apart only by their lists: a client
  // named by a connected one must have connected with this very list (the first to connect
  // wins there; docs/SECURITY.md).
  const ServedRank& self = *client.served();
  const fabric::Bytes own = self.addresses();
  for (const auto& other : attached_) {
    if (other.get() == &client || other->served() == nullptr) continue;
    const ServedRank& rank = *other->served();
    const bool named = std::find(group.begin(), group.end(), rank.addresses()) != group.end();
    const bool names_us =
        std::find(rank.group().begin(), rank.group().end(), own) != rank.group().end();
    if (!named && !names_us) continue;
    const bool same_tag = rank.job_tag() == self.job_tag();
    const bool untagged = same_tag && self.job_tag().empty();
    if (named && !same_tag)
      return fmt::format(
          "the address list names the fabric endpoint of {} (rank {} of another job on this "
          "daemon: its job credentials differ): a job may only connect to its own ranks",
          describe_peer(other->peer()), rank.rank());
    if (names_us && !same_tag) {
      stats_->refused.fetch_add(1, std::memory_order_relaxed);
      other->end("daemon.attach",
                 fmt::format("this client's address list names the fabric endpoint of {} (rank "
                             "{} of another job on this daemon, which has now connected): a job "
                             "may only connect to its own ranks",
                             describe_peer(client.peer()), self.rank()));
      continue;
    }
    if ((named && !rank.group().empty() && rank.group() != group) ||
        (names_us && rank.group() != group))
      return untagged ? fmt::format(
                            "the address list names the fabric endpoint of {} (rank {} of "
                            "another job on this daemon): a job may only connect to its own "
                            "ranks",
                            describe_peer(other->peer()), rank.rank())
                      : fmt::format(
                            "rank {} of this job ({}) connected with another address list: "
                            "the job's ranks disagree on its members",
                            rank.rank(), describe_peer(other->peer()));
  }
  return "";
}

}  // namespace proxyep::daemon
