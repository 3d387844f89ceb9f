#include "proxy/health.hpp"

#include "common/log.hpp"

namespace proxyep::proxy {

bool Health::record(Failure failure) {
  {
    std::lock_guard lock(mutex_);
    if (!failure_) {
      log::error("{}: {}", failure.phase, failure.message);
      failure_ = std::move(failure);
      failed_.store(true, std::memory_order_release);  // pairs with the acquire in failed()
      return true;
    }
  }
  log::debug("{} (after the first failure): {}", failure.phase, failure.message);
  return false;
}

std::optional<Failure> Health::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void Health::throw_if_failed() const {
  if (!failed()) return;
  auto copy = failure();
  if (copy) throw Error(copy->phase, copy->message);
}

}  // namespace proxyep::proxy
