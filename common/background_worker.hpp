// Work that runs in the background unless someone who needs it gets there first.
//
//   StealableTask   a body that runs exactly once: on the background thread, or on the first
//                   caller of run_or_wait() if the background thread has not started it yet
//                   (so waiting for it never costs more than running it; on a busy machine the
//                   background thread may not be scheduled for milliseconds).
//   BackgroundWorker one thread, started on first use, that runs submitted tasks in order (a
//                   CPU analog of a GPU stream): it starts a task only after the one before it
//                   finished, wherever that one ran. It runs at the lowest priority (nice 19): it
//                   uses cores nobody else wants, and never takes one from the caller, who runs a
//                   task itself when it needs the result first. Its destructor runs or waits for
//                   every task, then joins.
// Tasks never overlap as long as whoever steals them also takes them in submission order, each
// after the previous finished (LowLatencyMode::settle() does).
//
// Threads: submit() and run_or_wait() from any thread; a body runs on exactly one thread, and
// everything it did happens-before run_or_wait() returns (the state's release/acquire and the
// mutex).
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace proxyep {

class StealableTask {
 public:
  explicit StealableTask(std::function<void()> body) : body_(std::move(body)) {}

  // Runs the body here if nobody started it; returns whether this call ran it.
  bool try_run() {
    int pending = kPending;
    if (!state_.compare_exchange_strong(pending, kRunning, std::memory_order_acq_rel)) return false;
    try {
      body_();
    } catch (...) {
      error_ = std::current_exception();
    }
    body_ = nullptr;  // what it captured goes with it, on the thread that ran it
    {
      std::lock_guard lock(mutex_);
      state_.store(kDone, std::memory_order_release);
    }
    done_.notify_all();
    return true;
  }

  // Runs the body here if nobody started it, else waits until it finished; rethrows its error.
  void run_or_wait() {
    if (!try_run()) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return state_.load(std::memory_order_acquire) == kDone; });
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr int kPending = 0, kRunning = 1, kDone = 2;
  std::function<void()> body_;
  std::atomic<int> state_{kPending};
  std::exception_ptr error_;  // written by the runner before kDone, read after
  std::mutex mutex_;
  std::condition_variable done_;
};

class BackgroundWorker {
 public:
  BackgroundWorker() = default;
  ~BackgroundWorker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void submit(std::shared_ptr<StealableTask> task) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_one();
  }

 private:
  void run() {
    // Linux gives every thread its own nice value. Failing to lower it only costs overlap.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        task->run_or_wait();  // one someone else started: wait for it before the next
      } catch (...) {
        // The task's error is for whoever waits on it.
      }
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<StealableTask>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace proxyep
