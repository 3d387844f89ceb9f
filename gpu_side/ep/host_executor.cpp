// HostExecutor: a run hands out block indices from one shared cursor (next_) under mutex_; the
// caller and the woken workers all claim blocks until none is left. Blocks are coarse (a token
// range or a channel), so one lock per block costs nothing next to the block's work, and a lock
// keeps the "every claimed block finished before run() returns" argument simple:
// - run() publishes body_/blocks_ and bumps generation_ under the lock, then drains itself;
// - a block is counted in finished_ (under the lock) only after body(b) returned or threw;
// - run() returns once finished_ == blocks_, so no worker touches body_ of a finished run: a late
//   worker finds next_ == blocks_ and claims nothing.
// After the first exception the remaining unclaimed blocks are skipped (counted as finished).
#include "gpu_side/ep/host_executor.hpp"

#include "common/error.hpp"

#include <utility>

namespace proxyep::gpu_side::ep {

HostExecutor::HostExecutor(int threads) {
  require(threads >= 1, "host_executor", "threads must be >= 1; got {}", threads);
  try {
    workers_.reserve(static_cast<size_t>(threads - 1));
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this] { work(); });
  } catch (...) {
    // A thread failed to start: stop those already running, or their std::thread destructors
    // would terminate the process.
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& worker : workers_)
      worker.join();
    throw;
  }
}

HostExecutor::~HostExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_)
    worker.join();
}

void HostExecutor::run(int64_t blocks, const std::function<void(int64_t block)>& body) {
  if (blocks <= 0) return;
  std::lock_guard turn(turn_);
  // Nobody to share with (no workers, or one block): run inline, without the hand-off's locks
  // and wake-ups (a small Buffer call runs a dozen of these).
  if (blocks == 1 || threads() == 1) {
    for (int64_t b = 0; b < blocks; ++b)
      body(b);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    blocks_ = blocks;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  // Waking workers for a single block would only add a context switch.
  if (blocks > 1) wake_.notify_all();
  drain();
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return finished_ == blocks_; });
    body_ = nullptr;
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void HostExecutor::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    drain();
  }
}

void HostExecutor::drain() {
  std::unique_lock lock(mutex_);
  while (next_ < blocks_) {
    if (error_) {
      // Skip what nobody has started: the run is failing anyway.
      finished_ += blocks_ - next_;
      next_ = blocks_;
      break;
    }
    int64_t block = next_++;
    const auto* body = body_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*body)(block);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    ++finished_;
  }
  if (finished_ == blocks_) done_.notify_all();
}

}  // namespace proxyep::gpu_side::ep
