// What the daemon counts, shared between its poll loop (the only writer) and the metrics HTTP
// thread and status frames (readers). Every field is a relaxed atomic or fixed at start: a
// reader needs no lock and sees each value as of some recent moment, which is all a scrape or a
// status frame promises (the counts are not a consistent snapshot of one instant).
//
// Connection outcomes partition every connection the daemon accepted from the socket:
//   accepted       the handshake succeeded (welcome sent)
//   refused        the peer-credential check failed (access_policy.hpp)
//   bad_handshake  allowed, but no usable hello: malformed, another protocol version, a kind
//                  this build does not serve, cut short, or not in time
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace proxyep::daemon {

struct DaemonStats {
  // Fixed at start.
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::chrono::system_clock::time_point started_at;
  std::chrono::steady_clock::time_point started;

  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> bad_handshake{0};
  std::atomic<uint64_t> clients_attached{0};  // ranks whose proxy threads run here
  std::atomic<bool> draining{false};

  double uptime_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
};

}  // namespace proxyep::daemon
