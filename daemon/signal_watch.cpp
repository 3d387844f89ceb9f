#include "daemon/signal_watch.hpp"

#include "common/error.hpp"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace proxyep::daemon {
namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

SignalWatch::SignalWatch() {
  const sigset_t set = stop_signals();
  const int rc = ::pthread_sigmask(SIG_BLOCK, &set, &previous_);
  require(rc == 0, "daemon.signals", "cannot block SIGTERM and SIGINT: {}", std::strerror(rc));
  fd_ = control::Socket(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_.valid()) {
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    fail("daemon.signals", "signalfd: {}", std::strerror(error));
  }
}

SignalWatch::~SignalWatch() {
  while (take()) {
  }
  fd_.close();
  ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

std::optional<int> SignalWatch::take() {
  signalfd_siginfo info{};
  const ssize_t n = ::read(fd_.fd(), &info, sizeof info);
  if (n != static_cast<ssize_t>(sizeof info)) return std::nullopt;
  return static_cast<int>(info.ssi_signo);
}

}  // namespace proxyep::daemon
