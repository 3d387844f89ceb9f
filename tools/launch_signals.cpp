#include "tools/launch_signals.hpp"

#include <atomic>

namespace proxyep::tools {
namespace {

// A lock-free atomic rather than volatile sig_atomic_t: the handler may run on another thread
// than the launcher's loop (a signal goes to any thread that does not block it).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");

extern "C" void record_stop_signal(int signal) {
  int none = 0;
  // relaxed: the flag is the only data; the loop polls it and reacts on its next iteration.
  g_stop_signal.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

extern "C" void interrupt_poll(int) {}

// Scopes alive now (constructed and destroyed on the launcher's one thread): only the outermost
// starts with a clean flag, so a signal an outer scope recorded stays for the inner one.
int g_depth = 0;

}  // namespace

SignalScope::SignalScope() {
  if (g_depth++ == 0) g_stop_signal.store(0, std::memory_order_relaxed);
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    struct sigaction action {};
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;  // no SA_RESTART: the signal must cut poll() short
    int signal = kSignals[i];
    if (signal == SIGPIPE)
      action.sa_handler = SIG_IGN;
    else if (signal == SIGCHLD)
      action.sa_handler = interrupt_poll;
    else
      action.sa_handler = record_stop_signal;
    sigaction(signal, &action, &saved_[i]);
  }
}

SignalScope::~SignalScope() {
  --g_depth;
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    sigaction(kSignals[i], &saved_[i], nullptr);
}

int SignalScope::pending_stop_signal() {
  return g_stop_signal.load(std::memory_order_relaxed);
}

}  // namespace proxyep::tools
