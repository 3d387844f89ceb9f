// HostExecutor: the CPU twin's "grid". A small pool of worker threads runs the same block-level
// algorithm a CUDA kernel runs per thread block: run(blocks, body) calls body(b) once for every
// block b in [0, blocks), spread over the workers and the calling thread, and returns when all
// have finished. Workers sleep between runs (no spinning while the rank is idle).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::ep {

class HostExecutor {
 public:
  // `threads` >= 1 counts the calling thread: threads - 1 workers are started.
  explicit HostExecutor(int threads);
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Not reentrant (a body must not call run()). Callers on several threads take turns: a
  // Buffer's calls run from the caller's thread and from its communication stream's, and
  // get_dispatch_layout may overlap a call finishing in the background. The first exception a
  // block throws is rethrown here after every block has finished or been skipped.
  void run(int64_t blocks, const std::function<void(int64_t block)>& body);

 private:
  void work();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex turn_;  // held for a whole run
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t blocks_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace proxyep::gpu_side::ep
