#include "gpu_side/doorbell.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace proxyep::gpu_side {

Doorbell::Doorbell() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  require(fd_ >= 0, "gpu_side.doorbell", "eventfd failed: {}", std::strerror(errno));
}

Doorbell Doorbell::adopt(int fd) {
  require(fd >= 0, "gpu_side.doorbell", "cannot adopt invalid descriptor {}", fd);
  return Doorbell(fd);
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

Doorbell::Doorbell(Doorbell&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Doorbell& Doorbell::operator=(Doorbell&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Doorbell::kick() const noexcept {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: the waiter is already due to wake. EINTR: retry.
  while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

bool Doorbell::wait(std::chrono::nanoseconds timeout) const noexcept {
  pollfd pfd{.fd = fd_, .events = POLLIN, .revents = 0};
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  const timespec ts{.tv_sec = static_cast<time_t>(secs.count()),
                    .tv_nsec = static_cast<long>((timeout - secs).count())};
  if (::ppoll(&pfd, 1, &ts, nullptr) <= 0) return false;  // timeout or EINTR: caller re-checks
  uint64_t count = 0;
  // Consume the kicks (eventfd read resets the counter); EAGAIN if a racing read took them.
  return ::read(fd_, &count, sizeof(count)) == sizeof(count) || errno == EAGAIN;
}

RingWaiter::RingWaiter(RingConsumer& consumer, const Doorbell* doorbell, WaitPolicy policy)
    : consumer_(consumer), doorbell_(doorbell), policy_(policy) {}

Status RingWaiter::wait(const Deadline& deadline) {
  for (uint32_t i = 0; i < policy_.spins; ++i) {
    if (consumer_.ready()) return Status::ok;
    cpu_relax();
  }
  for (uint32_t i = 0; i < policy_.yields; ++i) {
    if (consumer_.ready()) return Status::ok;
    std::this_thread::yield();
  }
  for (;;) {
    if (consumer_.ready()) return Status::ok;
    if (deadline.expired()) return Status::timeout;
    sleep_once(deadline);
  }
}

void RingWaiter::sleep_once(const Deadline& deadline) {
  const auto left =
      std::max(Deadline::Clock::duration::zero(), deadline.end() - Deadline::Clock::now());
  if (doorbell_ == nullptr) {
    std::this_thread::sleep_for(std::min<Deadline::Clock::duration>(policy_.timed_sleep, left));
    return;
  }
  if (!consumer_.announce_sleep()) {
    // A producer reserved the next position and is about to publish it.
    std::this_thread::yield();
    return;
  }
  ++blocks_;
  (void)doorbell_->wait(std::min<Deadline::Clock::duration>(policy_.max_block, left));
  consumer_.end_sleep();
}

}  // namespace proxyep::gpu_side
