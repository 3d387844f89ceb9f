// Backlog: writes a proxy thread has popped and translated but could not post yet, because the
// destination's credit window is full or the provider said again. They stay with the thread
// (never dropped, never pushed back into the ring, whose slot is already free) in one FIFO per
// destination, so a congested destination does not hold up writes to the others and each
// destination's writes are posted in ring order.
//
// Threading: none; owned by one proxy thread.
#pragma once

#include "fabric/transport.hpp"

#include <cstddef>
#include <deque>
#include <vector>

namespace proxyep::proxy {

// A translated write and the rail (index into the fabric) it goes out on.
struct PendingWrite {
  fabric::WriteOp op;
  int rail = 0;
};

class Backlog {
 public:
  explicit Backlog(int ranks) : queues_(static_cast<size_t>(ranks)) {}

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  bool has(int dst) const { return !queues_[static_cast<size_t>(dst)].empty(); }
  std::deque<PendingWrite>& queue(int dst) { return queues_[static_cast<size_t>(dst)]; }
  int ranks() const { return static_cast<int>(queues_.size()); }

  void push_back(const PendingWrite& write) {
    queues_[static_cast<size_t>(write.op.peer)].push_back(write);
    ++size_;
  }
  // For writes taken out for posting that must go back first in line.
  void push_front(const PendingWrite& write) {
    queues_[static_cast<size_t>(write.op.peer)].push_front(write);
    ++size_;
  }
  void pop_front(int dst) {
    queues_[static_cast<size_t>(dst)].pop_front();
    --size_;
  }
  // Drops every write to `dst` (a failed peer), handing each to `dropped` first.
  template <typename F>
  void drop(int dst, F&& dropped) {
    auto& queue = queues_[static_cast<size_t>(dst)];
    for (const PendingWrite& write : queue)
      dropped(write);
    size_ -= queue.size();
    queue.clear();
  }

 private:
  std::vector<std::deque<PendingWrite>> queues_;
  size_t size_ = 0;
};

}  // namespace proxyep::proxy
