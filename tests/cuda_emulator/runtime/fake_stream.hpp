// What the fake runtime (fake_runtime.cpp: memory, streams, launches) and the fake driver
// (fake_driver.cpp: events, capture and graphs, IPC, pointer attributes) share: the stream, its
// progress (which events compare against), a capture sequence, and a few helpers.
//
// A stream is a worker thread running its queue in order. While the stream is part of a capture,
// what is queued on it is recorded into the capture instead of run, in the order the host queued
// it across every stream of the capture: a graph replays that order on one stream. The host's
// order is a valid order of the graph's nodes (a stream can only wait for a point recorded before
// the wait), so one stream running them in turn is one of the executions a GPU may choose.
#pragma once

#include "runtime/detector.hpp"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace cuemu {

// How far a stream got: the count of its queued items that completed. Shared with the events
// recorded on it, so an event outlives its stream (CUDA lets it).
struct Progress {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t completed = 0;

  void wait_for(uint64_t sequence) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return completed >= sequence; });
  }
  bool reached(uint64_t sequence) {
    std::lock_guard lock(mutex);
    return completed >= sequence;
  }
};

// One capture sequence (cudaStreamBeginCapture .. cudaStreamEndCapture), under capture_mutex().
struct Capture {
  unsigned long long id = 0;
  CUstream_st* origin = nullptr;
  int mode = 0;  // cudaStreamCaptureMode
  std::thread::id thread;
  cudaError_t invalid = cudaSuccess;  // why CUDA invalidated it, once it did
  bool ended = false;                 // cudaStreamEndCapture ran (its points are a graph's now)
  std::vector<std::function<void()>> nodes;
  std::vector<CUstream_st*> streams;  // the origin and every stream that joined
  std::vector<void*> allocations;     // cudaMallocAsync'ed inside it
  std::vector<void*> freed;           // of those, cudaFreeAsync'ed inside it: the graph's to free
};

// Guards every stream's capture fields and every Capture.
std::mutex& capture_mutex();

}  // namespace cuemu

struct CUstream_st {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  uint64_t pushed = 0;    // items ever queued: an event's sequence number
  size_t unfinished = 0;  // queued or running
  bool stopping = false;
  std::shared_ptr<cuemu::Progress> progress = std::make_shared<cuemu::Progress>();
  // Under cuemu::capture_mutex(): the capture this stream is part of, the count of capture nodes
  // when it last added one (0: none since it joined), and per stream of the capture the latest
  // such count this stream is ordered after (what cudaStreamEndCapture checks every fork joined).
  std::shared_ptr<cuemu::Capture> capture;
  uint64_t capture_tail = 0;
  std::map<CUstream_st*, uint64_t> ordered_after;
  std::thread worker;

  CUstream_st() : worker([this] { serve(); }) {}
  ~CUstream_st() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    worker.join();
  }

  // Queues `work`, or records it while the stream captures: cudaSuccess, or
  // cudaErrorStreamCaptureInvalidated for a capture CUDA invalidated (nothing recorded).
  cudaError_t push(std::function<void()> work) {
    {
      std::lock_guard lock(cuemu::capture_mutex());
      if (capture != nullptr) {
        if (capture->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
        capture->nodes.push_back(std::move(work));
        capture_tail = capture->nodes.size();
        return cudaSuccess;
      }
    }
    {
      std::lock_guard lock(mutex);
      queue.push_back(std::move(work));
      ++pushed;
      ++unfinished;
    }
    changed.notify_all();
    return cudaSuccess;
  }
  // The sequence number an event recorded now waits for.
  uint64_t end_sequence() {
    std::lock_guard lock(mutex);
    return pushed;
  }
  void drain() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [this] { return unfinished == 0; });
  }
  bool idle() {
    std::lock_guard lock(mutex);
    return unfinished == 0;
  }

 private:
  void serve() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> work = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      work();
      {
        std::lock_guard done(progress->mutex);
        ++progress->completed;
      }
      progress->changed.notify_all();
      lock.lock();
      --unfinished;
      changed.notify_all();
    }
  }
};

namespace cuemu {

// The stream a cudaStream_t names (null: the legacy stream).
CUstream_st& resolve(cudaStream_t stream);
// Sets the calling thread's last error to `status` and returns it.
cudaError_t fail(cudaError_t status);
// Waits until every stream, the legacy one included, ran what it was given.
void drain_all_streams();

// The device allocation (cudaMalloc, cudaMallocAsync) holding `address`: its base and size.
struct DeviceAllocation {
  void* base = nullptr;
  size_t bytes = 0;
  bool pooled = false;  // cudaMallocAsync's: not exportable by cudaIpcGetMemHandle
};
bool find_device_allocation(const void* address, DeviceAllocation* found);
// cudaMalloc's allocation without the capture rules; `pooled` as above.
cudaError_t allocate_device(void** pointer, size_t bytes, bool pooled);
// Forgets and frees a device allocation at once (no waiting); false for an unknown pointer.
bool release_device(void* pointer);

// The capture rules for a potentially unsafe call (cudaMalloc, cudaMemcpy, a synchronisation...)
// made by this thread now: cudaSuccess, or cudaErrorStreamCaptureUnsupported after invalidating
// the captures that forbid it (fake_driver.cpp).
cudaError_t unsafe_call_in_capture();
// cudaErrorStreamCaptureUnsupported for a call that must not act on a capturing stream
// (cudaStreamQuery, cudaStreamSynchronize), after invalidating its capture; else cudaSuccess.
cudaError_t refuse_if_capturing(CUstream_st& stream);
// Before a stream is destroyed: it leaves its capture, which CUDA then invalidates (the capture
// loses work it recorded), and no capture or stream keeps its address.
void detach_from_capture(CUstream_st& stream);

}  // namespace cuemu
