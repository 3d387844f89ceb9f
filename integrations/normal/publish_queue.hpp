// PublishQueue: what a call hands on (a chunk to send, a slot's credit to return) once the
// backend's work before it is done (RowBackend's completion rule), in the order it was queued.
//
// A host backend's work is done when it returns, so everything is published the moment it is
// queued, exactly as if there were no queue. A device backend's work is still running: its
// publications wait, and the stream loop meanwhile fills chunks for other peers, so the
// kernels of one chunk overlap the post of the one before it. Order matters only within one
// peer's stream, but the backend's work finishes in the order it was queued, so keeping every
// publication in that order costs nothing.
//
// A publication that the backend's stream itself hands on after the work before it (a write to
// another node while the session routes posts through the stream: PeerChannel::
// posts_in_stream_order) needs no wait: it runs at once, ahead of the waiting ones, which only
// reorders publications of different peers.
#pragma once

#include "integrations/backend/row_backend.hpp"

#include <deque>
#include <functional>
#include <string_view>
#include <utility>

namespace proxyep::integrations::normal {

class PublishQueue {
 public:
  PublishQueue(RowBackend& backend, std::string_view phase) : backend_(backend), phase_(phase) {}

  // `publish` runs once the backend's work queued so far is done: here, if it is already, else
  // from a later publish_ready() or publish_all(). `in_stream_order`: at once (above).
  void after_work(std::function<void()> publish, bool in_stream_order = false) {
    if (in_stream_order) {
      publish();
      return;
    }
    queue_.push_back({backend_.mark(), std::move(publish)});
    publish_ready();
  }

  // Runs, oldest first, the publications whose work is done, without waiting for the backend.
  // Returns whether any ran.
  bool publish_ready() {
    bool any = false;
    while (!queue_.empty() && backend_.reached(queue_.front().mark, phase_)) {
      run_front();
      any = true;
    }
    return any;
  }

  // Runs them all, waiting for the backend (at most ep.timeout_ms each).
  void publish_all() {
    while (!queue_.empty()) {
      backend_.wait(queue_.front().mark, phase_);
      run_front();
    }
  }

  bool empty() const { return queue_.empty(); }

 private:
  struct Pending {
    RowBackend::Mark mark;
    std::function<void()> publish;
  };

  void run_front() {
    // Off the queue first: a publication that throws fails the call, and is not run twice.
    std::function<void()> publish = std::move(queue_.front().publish);
    queue_.pop_front();
    publish();
  }

  RowBackend& backend_;
  const std::string_view phase_;
  std::deque<Pending> queue_;
};

}  // namespace proxyep::integrations::normal
