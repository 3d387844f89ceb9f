// proxyepd's control plane: one thread, one poll(2) loop over the listening Unix socket, the
// clients, the stop signals and a wake-up eventfd. Nothing in the loop blocks: every socket is
// non-blocking and every client stage has a deadline (client_connection.hpp), so one stalled
// client never delays another.
//
// Life cycle:
//   Daemon d(options);  // takes the socket (unix_listener.hpp), starts metrics; throws Error
//   d.run();            // logs "proxyepd: serving PATH", serves until a stop request, drains
// A stop request (SIGTERM/SIGINT through signal_watch.hpp, or request_drain()) starts the
// drain: the listening socket is closed and its file removed at once (a new daemon may take
// the path while this one finishes), the connections in progress get daemon.drain_timeout_ms
// to finish, then run() returns. A second stop request ends the drain at once. run() returns
// normally after a drain; it throws only when poll() itself fails.
//
// Threads: the loop is the only writer of everything here; the metrics exporter's HTTP thread
// reads DaemonStats' atomics only (daemon_stats.hpp). request_drain() may be called from any
// thread, or a signal handler (an atomic store and an eventfd write).
#pragma once

#include "daemon/attached_client.hpp"
#include "daemon/client_connection.hpp"
#include "daemon/daemon_metrics.hpp"
#include "daemon/daemon_options.hpp"
#include "daemon/daemon_stats.hpp"
#include "daemon/signal_watch.hpp"
#include "daemon/unix_listener.hpp"
#include "metrics/metrics_exporter.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::daemon {

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  void run();
  void request_drain() noexcept;

  const std::string& socket_path() const { return options_.socket_path; }
  // The metrics endpoint's port (the one chosen for metrics.port 0), or -1 when off.
  int metrics_port() const { return exporter_ ? exporter_->port() : -1; }
  const DaemonStats& stats() const { return *stats_; }

 private:
  bool finished() const;
  void poll_once();
  int poll_timeout_ms() const;
  void begin_drain(std::string_view why);
  void take_stop_requests(bool wake_ready, bool signal_ready);
  void expire_deadlines();
  std::string metrics_url() const;
  // daemon_accept.cpp: new connections, their credentials and their hellos.
  void accept_pending();
  void admit(control::Socket socket);
  void service(ClientConnection& client, short revents);
  void on_hello(ClientConnection& client, const nlohmann::json& message);
  // "" when `client` may connect to `group` (isolation between jobs, served_rank.hpp); ends any
  // client of another job that named `client`'s endpoint.
  std::string check_group(const AttachedClient& client, const std::vector<fabric::Bytes>& group);
  // Turns of the loop for attached clients: setup progress, failures, the gauge.
  void tend_attached();
  void return_freed_memory();

  DaemonOptions options_;
  std::shared_ptr<DaemonStats> stats_;  // shared with the metrics callback
  std::shared_ptr<ServedRanks> served_ = std::make_shared<ServedRanks>();  // likewise
  std::unique_ptr<SignalWatch> signals_;
  control::Socket wake_;  // eventfd written by request_drain()
  std::atomic<bool> drain_requested_{false};
  UnixListener listener_;
  std::unique_ptr<metrics::MetricsExporter> exporter_;
  std::vector<std::unique_ptr<ClientConnection>> clients_;
  std::vector<std::unique_ptr<AttachedClient>> attached_;  // ranks this daemon proxies
  std::optional<Deadline> drain_deadline_;
  Deadline::Clock::time_point accept_paused_until_{};  // after EMFILE and the like
};

// "pid 123 (uid 0, gid 0)": a client as the daemon's log names it.
std::string describe_peer(const PeerCredentials& peer);

}  // namespace proxyep::daemon
