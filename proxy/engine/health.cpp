#include "proxy/engine/health.hpp"

#include "common/log.hpp"

namespace proxyep::proxy {

bool Health::record(Failure failure) {
  if (failure.peer >= 0 && static_cast<size_t>(failure.peer) < peer_failed_.size()) {
    std::lock_guard lock(mutex_);
    auto& first = peer_failures_[static_cast<size_t>(failure.peer)];
    if (first) {
      log::debug("{} (rank {} failed already): {}", failure.phase, failure.peer, failure.message);
      return false;
    }
    log::warn("{}: {} (only rank {} is given up)", failure.phase, failure.message, failure.peer);
    first = failure;
    peer_failed_[static_cast<size_t>(failure.peer)].store(true, std::memory_order_release);
    return true;
  }
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

void Health::tolerate_peer_failures(int ranks) {
  std::lock_guard lock(mutex_);
  peer_failed_ = std::vector<std::atomic<bool>>(static_cast<size_t>(ranks));
  peer_failures_.assign(static_cast<size_t>(ranks), std::nullopt);
}

std::optional<Failure> Health::peer_failure(int peer) const {
  if (!peer_failed(peer)) return std::nullopt;
  std::lock_guard lock(mutex_);
  return peer_failures_[static_cast<size_t>(peer)];
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
