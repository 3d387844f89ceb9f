#include "proxy/engine/wait_notifier.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace proxyep::proxy {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain, lock-free 32-bit atomic");

long futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void WaitNotifier::wake_all() noexcept {
  (void)futex(generation_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
}

void WaitNotifier::wait_while(uint32_t seen, std::chrono::microseconds timeout) noexcept {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>(timeout.count() % 1000000) * 1000};
  // EAGAIN (the generation moved), EINTR and ETIMEDOUT all mean: re-check the condition.
  (void)futex(generation_, FUTEX_WAIT_PRIVATE, seen, &ts);
}

}  // namespace proxyep::proxy
