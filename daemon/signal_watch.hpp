// SIGTERM and SIGINT as readable events on a file descriptor (signalfd), so the daemon's poll
// loop handles a stop request like any other input and no work runs in a signal handler.
//
// The constructor blocks both signals in the calling thread; threads it creates later (the
// metrics HTTP server's) inherit the mask, so the kernel keeps the signal pending for the
// signalfd instead of running the default action (death) on some thread. Create the watch
// before any other thread of the process starts. The destructor reads away what is still
// pending and restores the previous mask.
#pragma once

#include "control/tcp_socket.hpp"

#include <signal.h>

#include <optional>

namespace proxyep::daemon {

class SignalWatch {
 public:
  SignalWatch();  // throws proxyep::Error("daemon.signals")
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return fd_.fd(); }
  // The next pending signal's number, or nullopt when none is pending.
  std::optional<int> take();

 private:
  control::Socket fd_;  // the signalfd (an RAII file descriptor)
  sigset_t previous_{};
};

}  // namespace proxyep::daemon
