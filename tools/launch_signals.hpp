// Signal dispositions of the local launcher while it runs (tools/launcher.hpp), restored when
// the scope ends. SIGINT/SIGTERM/SIGHUP are recorded, not fatal, so the launcher can stop its
// ranks (they live in their own process groups and do not see a terminal's Ctrl-C) before it
// exits. SIGCHLD gets a handler that does nothing but interrupt poll(), so a rank's exit is
// noticed at once. SIGPIPE is ignored: a closed stdout must not kill the launcher before it
// has stopped its children. Scopes nest (the testbed's around the launcher's): a signal recorded
// in an outer scope is still pending in an inner one, so none is lost between the two.
#pragma once

#include <csignal>

namespace proxyep::tools {

class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  // The first SIGINT/SIGTERM/SIGHUP received while a scope was active; 0 if none.
  static int pending_stop_signal();

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
  struct sigaction saved_[sizeof kSignals / sizeof kSignals[0]];
};

}  // namespace proxyep::tools
