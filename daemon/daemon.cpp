// Daemon: construction, the poll loop, draining (daemon.hpp). Accepting and the handshake are
// in daemon_accept.cpp.
#include "daemon/daemon.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/daemon_handshake.hpp"
#include "daemon/daemon_metrics.hpp"
#include "fabric/shm_stale.hpp"

#include <malloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace proxyep::daemon {

namespace {

constexpr std::chrono::milliseconds kSetupTick{1};
constexpr std::chrono::milliseconds kRunningTick{20};

}  // namespace

Daemon::Daemon(DaemonOptions options)
    : options_(std::move(options)), stats_(std::make_shared<DaemonStats>()) {
  stats_->pid = ::getpid();
  stats_->uid = ::getuid();
  stats_->gid = ::getgid();
  stats_->started_at = std::chrono::system_clock::now();
  stats_->started = std::chrono::steady_clock::now();
  // Signals first: the metrics exporter's thread must inherit the blocked mask.
  if (options_.handle_signals) signals_ = std::make_unique<SignalWatch>();
  wake_ = control::Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  require(wake_.valid(), "daemon.start", "eventfd: {}", control::errno_text(errno));
  listener_ = UnixListener::open(options_.socket_path, options_.socket_mode);
  if (options_.metrics_port >= 0) {
    exporter_ = metrics::MetricsExporter::start(
        options_.metrics_address, options_.metrics_port, {},
        [stats = stats_, served = served_](metrics::MetricsSink& sink) {
          collect_daemon_metrics(sink, *stats, *served);
        });
    log::info("proxyepd: metrics at {}", metrics_url());
  }
}

Daemon::~Daemon() {
  exporter_.reset();  // joins the HTTP thread: no scrape reads a served rank from here on, and
                      // it ends before the signal mask is restored
  served_->entries.clear();
  attached_.clear();
  clients_.clear();
  listener_.close();
  signals_.reset();
}

void Daemon::request_drain() noexcept {
  drain_requested_.store(true, std::memory_order_release);  // acquire: take_stop_requests
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.fd(), &one, sizeof one);
}

void Daemon::run() {
  log::info("proxyepd: serving {} (pid {}; serves {}; protocol version {})", options_.socket_path,
            stats_->pid, options_.access.describe(), control::kProtocolVersion);
  // The shm regions dead processes left on the node (a daemon killed before this one, ranks of
  // in-process jobs): before the first job, which may need their RAM or their names.
  fabric::remove_stale_shm_regions();
  while (!finished())
    poll_once();
  if (!clients_.empty() || !attached_.empty()) {
    log::warn("proxyepd: the drain deadline ({} ms) passed: dropping {} connection(s)",
              options_.drain_timeout.count(), clients_.size() + attached_.size());
    for (auto& client : attached_)
      client->end("daemon.drain", "proxyepd is shutting down (its drain deadline passed)");
    attached_.clear();
    clients_.clear();
  }
  log::info("proxyepd: drained, exiting");
}

bool Daemon::finished() const {
  return drain_deadline_ && ((clients_.empty() && attached_.empty()) || drain_deadline_->expired());
}

std::string Daemon::metrics_url() const {
  return exporter_ ? fmt::format("http://{}:{}/metrics", exporter_->address(), exporter_->port())
                   : std::string();
}

void Daemon::poll_once() {
  std::vector<pollfd> fds;
  fds.push_back({wake_.fd(), POLLIN, 0});
  if (signals_) fds.push_back({signals_->fd(), POLLIN, 0});
  const size_t first_client = fds.size();
  const size_t client_count = clients_.size();
  for (const auto& client : clients_)
    fds.push_back({client->fd(), client->poll_events(), 0});
  const size_t first_attached = fds.size();
  const size_t attached_count = attached_.size();
  for (const auto& client : attached_)
    fds.push_back({client->fd(), POLLIN, 0});
  const bool accepting = listener_.listening() &&
                         client_count < static_cast<size_t>(options_.max_connections) &&
                         Deadline::Clock::now() >= accept_paused_until_;
  if (accepting) fds.push_back({listener_.fd(), POLLIN, 0});

  if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0) {
    require(errno == EINTR, "daemon.poll", "poll: {}", control::errno_text(errno));
    return;
  }
  take_stop_requests(fds[0].revents != 0, signals_ && fds[1].revents != 0);
  for (size_t i = 0; i < client_count; ++i)
    if (fds[first_client + i].revents != 0) service(*clients_[i], fds[first_client + i].revents);
  for (size_t i = 0; i < attached_count; ++i)
    if (fds[first_attached + i].revents != 0) attached_[i]->on_readable();
  tend_attached();
  // After the clients: accepting appends to clients_, and the loop above indexes it.
  if (accepting && listener_.listening() && (fds.back().revents & POLLIN)) accept_pending();
  expire_deadlines();
  std::erase_if(clients_, [](const auto& client) { return client->done(); });
}

int Daemon::poll_timeout_ms() const {
  std::optional<Deadline::Clock::time_point> next;
  auto consider = [&](Deadline::Clock::time_point at) { next = next ? std::min(*next, at) : at; };
  for (const auto& client : clients_)
    consider(client->deadline().end());
  if (drain_deadline_) consider(drain_deadline_->end());
  if (accept_paused_until_ > Deadline::Clock::now()) consider(accept_paused_until_);
  // Attached clients: their fabric is progressed here while they set up (their peers' connection
  // requests), and a proxy failure is noticed within a tick once they run.
  for (const auto& client : attached_)
    consider(Deadline::Clock::now() + (client->in_setup() ? kSetupTick : kRunningTick));
  if (!next) return -1;
  // Rounded up: waking a little late is fine, waking early spins until the deadline.
  const auto left = *next - Deadline::Clock::now();
  return static_cast<int>(
      std::max<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 0));
}

void Daemon::tend_attached() {
  uint64_t running = 0;
  for (auto& client : attached_) {
    client->tick();
    running += client->running() ? 1 : 0;
  }
  const size_t before = attached_.size();
  std::erase_if(attached_, [](const auto& client) { return client->done(); });
  stats_->clients_attached.store(running, std::memory_order_relaxed);
  {
    std::vector<ServedRanks::Entry> entries;
    for (const auto& client : attached_)
      if (client->running()) entries.push_back({client->served_shared(), client->peer().pid});
    std::lock_guard lock(served_->mutex);
    served_->entries.swap(entries);  // the old list goes when `entries` does, outside the lock
  }
  // After the old list: it may hold a departed client's last reference.
  if (attached_.size() < before) return_freed_memory();
}

void Daemon::return_freed_memory() {
  // A client's fabric (the provider's buffer pools) is tens of MiB of heap. glibc keeps what is
  // freed unless it sits at the top of the heap, so without this a daemon serving clients for
  // weeks would hold the high-water mark of all of them that ever overlapped. Once per departure.
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

void Daemon::take_stop_requests(bool wake_ready, bool signal_ready) {
  if (wake_ready) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(wake_.fd(), &count, sizeof count);
    if (drain_requested_.exchange(false, std::memory_order_acquire)) begin_drain("drain requested");
  }
  if (signal_ready)
    while (const auto signal = signals_->take())
      begin_drain(*signal == SIGTERM ? "SIGTERM" : *signal == SIGINT ? "SIGINT" : "signal");
}

void Daemon::begin_drain(std::string_view why) {
  if (stats_->draining.load(std::memory_order_relaxed)) {
    log::warn("proxyepd: {} while draining: ending the drain now", why);
    drain_deadline_ = Deadline(std::chrono::milliseconds(0));
    return;
  }
  stats_->draining.store(true, std::memory_order_relaxed);
  listener_.close();
  drain_deadline_ = Deadline(options_.drain_timeout);
  log::info(
      "proxyepd: {}: draining: stopped accepting and removed {}; {} connection(s) in progress "
      "get up to {} ms",
      why, options_.socket_path, clients_.size(), options_.drain_timeout.count());
}

void Daemon::expire_deadlines() {
  for (auto& client : clients_) {
    if (client->done() || !client->deadline().expired()) continue;
    const auto timeout = options_.io_timeout.count();
    switch (client->stage()) {
      case ClientConnection::Stage::hello:
        stats_->bad_handshake.fetch_add(1, std::memory_order_relaxed);
        log::warn("proxyepd: dropped {}: no complete hello within {} ms",
                  describe_peer(client->peer()), timeout);
        break;
      case ClientConnection::Stage::replying:
        log::warn("proxyepd: dropped {}: it did not read the answer within {} ms",
                  describe_peer(client->peer()), timeout);
        break;
      case ClientConnection::Stage::closing:  // answered; it just has not closed its end
      case ClientConnection::Stage::done:
        break;
    }
    client->drop();
  }
}

std::string describe_peer(const PeerCredentials& peer) {
  return fmt::format("pid {} (uid {}, gid {})", peer.pid, peer.uid, peer.gid);
}

}  // namespace proxyep::daemon
