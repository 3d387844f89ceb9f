#include "common/signal_hygiene.hpp"

#include "common/log.hpp"

#include <dlfcn.h>

#include <csignal>
#include <cstring>
#include <string_view>

namespace proxyep {
namespace {

// The signals libinfinipath and libpsm2 take (a superset, so a newer one is covered too).
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGQUIT, SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE};

// Whether `address` is code of one of the libraries that take signals.
bool in_taking_library(void* address) {
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr)
    return false;
  std::string_view path(info.dli_fname);
  const auto slash = path.rfind('/');
  const std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  return name.starts_with("libinfinipath") || name.starts_with("libpsm");
}

}  // namespace

std::vector<int> restore_signals_taken_by_libraries() {
  std::vector<int> restored;
  for (int signal : kSignals) {
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) != 0) continue;
    void* handler = (current.sa_flags & SA_SIGINFO) != 0
                        ? reinterpret_cast<void*>(current.sa_sigaction)
                        : reinterpret_cast<void*>(current.sa_handler);
    if (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN) continue;
    if (!in_taking_library(handler)) continue;
    struct sigaction defaults {};
    defaults.sa_handler = SIG_DFL;
    sigemptyset(&defaults.sa_mask);
    if (::sigaction(signal, &defaults, nullptr) == 0) restored.push_back(signal);
  }
  if (!restored.empty())
    log::debug(
        "signals: restored the default action of {} signal(s) ({}...) that a library loaded "
        "with libfabric had taken (IPATH_NO_BACKTRACE=1 / HFI_NO_BACKTRACE=1 keep it from doing "
        "so)",
        restored.size(), strsignal(restored.front()));
  return restored;
}

}  // namespace proxyep
