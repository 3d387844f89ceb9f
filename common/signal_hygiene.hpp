// Signal handlers that libraries loaded under libfabric take without asking. Debian's libfabric
// links the PSM providers' libraries, and libinfinipath's load-time constructor installs its own
// handler for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT (unless IPATH_NO_BACKTRACE is
// set), which calls exit(1): a rank asked to stop with SIGTERM then runs its static destructors
// beside its live threads (and may hang there until SIGKILL) instead of dying; Ctrl-C in Python
// exits 1 without a KeyboardInterrupt; a crash loses its core. libpsm2 does the same unless
// HFI_NO_BACKTRACE is set. ProxyEP uses neither provider.
#pragma once

#include <vector>

namespace proxyep {

// IPATH_NO_BACKTRACE=1 and HFI_NO_BACKTRACE=1 keep those libraries' hands off the signals when
// set before anything loads them: the launcher gives them to its ranks, the Python package sets
// them before it loads its native module. Other programs rely on the restore below.

// Puts back the default action of every signal whose handler lives in one of those libraries
// (found by the handler's address) and returns those signals; handlers of anyone else, the
// program's own included, are left alone. Idempotent and cheap; safe to call from any thread.
std::vector<int> restore_signals_taken_by_libraries();

}  // namespace proxyep
