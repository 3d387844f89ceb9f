// The waits every session kind shares: noticing that a rank the wait needs has left, and how a
// wait without proxy threads to sleep on polls (spin, yield, nap).
#pragma once

#include "common/backoff.hpp"
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/peer_watch.hpp"
#include "proxy/session/session.hpp"

#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace proxyep::proxy {

inline constexpr uint32_t kSpinsBeforeYield = 64;  // see Poller
inline constexpr uint32_t kPollsPerClockRead = 256;

// Notices, while a wait polls, that a rank it waits for has left: a node peer's process exited
// (its channel says so). Reading the clock on every poll cost ~4% of a small call, and kill() is
// a system call, so it looks every 256th poll, at most every 50 ms.
class DepartureWatch {
 public:
  DepartureWatch(const Session& session, const Wait& wait, const control::PeerWatch* peers)
      : session_(session), wait_(wait), peers_(peers) {}

  // Sticky: the engine's wait may call its predicate again after a true answer.
  bool departed() {
    if (!departure_.empty()) return true;
    // A rank anywhere in the job that died: the bootstrap's liveness (one atomic load).
    if (peers_ != nullptr)
      if (auto gone = peers_->failure()) {
        departure_ = fmt::format("rank {} left the job ({})", gone->rank, gone->reason);
        return true;
      }
    if (++polls_ < kPollsPerClockRead) return false;
    polls_ = 0;
    auto now = std::chrono::steady_clock::now();
    if (now - last_look_ < std::chrono::milliseconds(50)) return false;
    last_look_ = now;
    for (int r = 0; r < session_.ranks(); ++r) {
      if (r == session_.rank() || !wait_.pending(r)) continue;
      if (auto gone = session_.channel(r).departed()) {
        departure_ = *gone;
        return true;
      }
    }
    return false;
  }
  const std::string& departure() const { return departure_; }

 private:
  const Session& session_;
  const Wait& wait_;
  const control::PeerWatch* peers_;
  std::string departure_;
  uint32_t polls_ = 0;
  std::chrono::steady_clock::time_point last_look_ = std::chrono::steady_clock::now();
};

// How a wait without a proxy (one node) polls: spin briefly, then yield, then nap.
// Spin only briefly before yielding: the peer we wait for is often runnable on this very core (a
// rank woken by our own message is placed next to us), and it runs only when we yield. With a
// spin of 2000 pauses both ranks of a 2-core machine took ~360 us per call after a barrier
// instead of ~20 us. Past ~20000 polls, short sleeps keep a long wait off the cores.
class Poller {
 public:
  void pause() {
    if (++polls_ < 20000)
      backoff_.pause();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 private:
  Backoff backoff_{kSpinsBeforeYield};
  uint64_t polls_ = 0;
};

// Polls `ready()` until it holds (a Poller between polls); throws proxyep::Error(phase) with
// describe_timeout() once `deadline` expired, read every kPollsPerClockRead polls. The waits with
// no proxy threads to sleep on: one node, and a rank whose proxy is the node daemon.
template <typename Ready, typename Describe>
void poll_until(Ready&& ready, const Deadline& deadline, std::string_view phase,
                Describe&& describe_timeout) {
  Poller poller;
  for (uint32_t polls = 1; !ready(); ++polls) {
    if (polls % kPollsPerClockRead == 0 && deadline.expired())
      fail(std::string(phase), "{}", describe_timeout());
    poller.pause();
  }
}

// A timed-out wait in words: what did not arrive from which ranks, and where each stands.
inline std::string describe_missing(const Session& session, const Wait& wait,
                                    std::chrono::milliseconds timeout) {
  std::string missing, where;
  for (int r = 0; r < session.ranks(); ++r) {
    if (!wait.pending(r)) continue;
    missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
    if (wait.detail) where += fmt::format("; rank {}: {}", r, wait.detail(r));
  }
  return fmt::format("{} from rank(s) {} did not arrive within {} ms{}", wait.what, missing,
                     timeout.count(), where);
}

// A wait with on_lost (rank masking): waits in ticks of 20 ms through `wait_tick(ready_or_tick)`
// (the session's own way of waiting for a predicate) and offers lost ranks to on_lost between
// ticks, then late ones at the deadline.
template <typename WaitTick>
void await_tolerant(const Session& session, const Wait& wait, std::chrono::milliseconds timeout,
                    WaitTick&& wait_tick) {
  const auto deadline = Deadline(timeout);
  auto offer = [&](int r, const std::string& why) {
    if (!wait.on_lost(r, why))
      fail(std::string(wait.phase), "{} while this rank waited for {}", why, wait.what);
  };
  while (!wait.ready()) {
    const auto tick_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    const std::function<bool()> ready_or_tick = [&] {
      return wait.ready() || std::chrono::steady_clock::now() >= tick_end;
    };
    wait_tick(ready_or_tick);
    if (wait.ready()) return;
    for (int r = 0; r < session.ranks(); ++r)
      if (wait.pending(r))
        if (auto why = session.peer_lost(r)) offer(r, *why);
    if (!deadline.expired()) continue;
    for (int r = 0; r < session.ranks(); ++r)
      if (wait.pending(r))
        offer(r, fmt::format("rank {} did not deliver {} within {} ms", r, wait.what,
                             timeout.count()));
    if (!wait.ready())
      fail(std::string(wait.phase), "{} did not arrive within {} ms", wait.what, timeout.count());
  }
}

}  // namespace proxyep::proxy
