// The data path of a proxy thread: completions, descriptors -> writes, the backlog, retirement.
// The loop, idling and health checks are in proxy_thread.cpp; the design is in proxy_thread.hpp.
#include "proxy/engine/proxy_thread.hpp"

#include "proxy/engine/route_completion.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace proxyep::proxy {
namespace {

constexpr int kMaxPollsPerRail = 8;  // per pass, so posting is never starved by a CQ flood

}  // namespace

bool ProxyThread::drain_completions() {
  bool worked = false;
  for (int rail : config_.rails) {
    fabric::Transport& transport = fabric_.rail(rail);
    for (int polls = 0; polls < kMaxPollsPerRail; ++polls) {
      size_t count = 0;
      Status status = transport.poll(completions_, count);
      for (size_t i = 0; i < count; ++i) {
        const fabric::Completion& c = completions_[i];
        if (c.kind == fabric::Completion::Kind::local_write) {
          on_local_completion(c);
        } else if (route_completion(sink_, c) == Status::ok) {
          progressed_ = true;
          bump(counters_.remote);
        } else {
          fail("proxy.route", -1,
               fmt::format("rank {}: remote completion with immediate {:#010x} on rail {}: {}",
                           config_.rank, c.imm, rail, sink_.last_error()));
        }
      }
      worked |= count > 0;
      if (status != Status::ok) {
        bump(counters_.cq_errors);
        // Named after the write's peer when the transport knows which write failed. Without
        // tolerated peer failures the engine fails (the first failure is what waiters see);
        // with them only that peer does, and the write is finished so quiet() does not wait.
        const int peer = failed_write_peer(transport.last_failed_cookie());
        fail("proxy.complete", peer,
             fmt::format("rank {}: {}", config_.rank, transport.last_error()));
        if (peer >= 0 && health_.peer_failed(peer)) give_up(peer);
        worked = true;
        continue;
      }
      if (count < completions_.size()) break;
    }
  }
  return worked;
}

void ProxyThread::on_local_completion(const fabric::Completion& c) {
  size_t lane_index = static_cast<size_t>(c.cookie >> kCookiePositionBits);
  RingLane::Entry* entry = nullptr;
  uint64_t position = 0;
  if (lane_index < lanes_.size()) {
    RingLane& lane = *lanes_[lane_index];
    position = lane.expand(c.cookie, kCookiePositionBits);
    entry = lane.find(position);
  }
  if (entry == nullptr) {
    fail("proxy.complete", c.peer,
         fmt::format("rank {}: a local completion (cookie {:#x}, peer {}) matches no write in "
                     "flight",
                     config_.rank, c.cookie, c.peer));
    return;
  }
  credits_.release(entry->dst, entry->bytes);
  const auto now = Clock::now();
  touch(entry->dst, now);
  const int64_t now_ns = ns_of(now);
  if (entry->posted_ns != 0) counters_.latency.record(now_ns - entry->posted_ns);
  last_completion_ns_[static_cast<size_t>(entry->dst)].store(now_ns, std::memory_order_relaxed);
  finish(lane_index, position);
  bump(counters_.completed);
}

bool ProxyThread::post_backlog() {
  bool worked = false;
  const int64_t now_ns = ns_of(Clock::now());
  for (int dst = 0; dst < backlog_.ranks() && !backlog_.empty(); ++dst) {
    auto& queue = backlog_.queue(dst);
    while (!queue.empty()) {
      PendingWrite& write = queue.front();
      if (credits_.acquire(dst, write.op.length) != Status::ok) break;
      write.op.more = false;
      fabric::Transport& rail = fabric_.rail(write.rail);
      Status status = rail.write(write.op);
      if (status == Status::again) {
        credits_.release(dst, write.op.length);
        return worked;  // the provider is busy: completions first, then retry
      }
      if (status == Status::ok) {
        count_posted(write);
        // Its latency counts from now, not from when it waited its turn (admit()'s stamp).
        const auto lane_index = static_cast<size_t>(write.op.cookie >> kCookiePositionBits);
        RingLane& lane = *lanes_[lane_index];
        if (RingLane::Entry* entry = lane.find(lane.expand(write.op.cookie, kCookiePositionBits)))
          entry->posted_ns = now_ns;
      } else {
        credits_.release(dst, write.op.length);
        finish_unposted(write, rail.last_error());
      }
      backlog_.pop_front(dst);
      worked = true;
    }
  }
  return worked;
}

bool ProxyThread::pop_and_post(size_t lane_index) {
  RingLane& lane = *lanes_[lane_index];
  size_t count = lane.pop(burst_);
  if (count == 0) return false;
  uint64_t first = lane.next_position() - count;
  bump(counters_.descriptors, count);
  const auto now = Clock::now();
  ready_.clear();
  for (size_t i = 0; i < count; ++i)
    admit(lane_index, first + i, burst_[i], now);
  post_ready();
  return true;
}

// Decodes, validates and translates one popped descriptor; it then either needs no write (its
// position finishes at once), is ready to post with this burst, or waits in the backlog.
void ProxyThread::admit(size_t lane_index, uint64_t position, const gpu_side::WireDescriptor& wire,
                        Clock::time_point now) {
  RingLane& lane = *lanes_[lane_index];
  gpu_side::Descriptor d;
  gpu_side::DecodeResult decoded = gpu_side::decode(wire, d);
  if (decoded != gpu_side::DecodeResult::ok) {
    fail(
        "proxy.decode", -1,
        fmt::format("rank {}: ring {} of proxy thread {}, position {}: {} descriptor", config_.rank,
                    lane_index, config_.index, position, gpu_side::to_string(decoded)));
    finish(lane_index, position);
    return;
  }
  if (d.op == gpu_side::Op::nop) {
    finish(lane_index, position);
    return;
  }
  WriteRequest request{.dst = static_cast<int>(std::min<uint32_t>(d.dst_rank, INT32_MAX)),
                       .local_region = d.local_region,
                       .remote_region = d.remote_region,
                       .src_offset = d.src_offset,
                       .dst_offset = d.dst_offset,
                       .length = d.length,
                       .cookie = d.cookie,
                       .op = gpu_side::to_string(d.op)};
  PendingWrite write;
  write.rail = config_.rails[next_rail_++ % config_.rails.size()];
  std::string why;
  if (regions_.translate(request, write.rail, write.op, why) != Status::ok) {
    bool known = request.dst >= 0 && request.dst < config_.ranks;
    fail("proxy.translate", known ? request.dst : -1,
         fmt::format("rank {}: {}", config_.rank, why));
    finish(lane_index, position);
    return;
  }
  const int dst = request.dst;
  if (dead_[static_cast<size_t>(dst)]) {
    finish(lane_index, position);  // the failure is already recorded; nothing goes there
    return;
  }
  write.op.imm = d.imm;
  write.op.cookie = make_cookie(lane_index, position);
  if (credits_.at(dst).idle() && !backlog_.has(dst)) touch(dst, now);
  lane.track(position, dst, d.length, ns_of(now));
  if (backlog_.has(dst) || credits_.acquire(dst, d.length) != Status::ok) {
    backlog_.push_back(write);
    bump(counters_.backlogged);
    return;
  }
  ready_.push_back(write);
}

// Posts the writes admitted from one burst: FI_MORE on all but the last write of each rail, so
// the provider may ring the NIC's doorbell once per burst.
void ProxyThread::post_ready() {
  for (size_t i = 0; i < ready_.size(); ++i) {
    PendingWrite& write = ready_[i];
    write.op.more = false;
    for (size_t j = i + 1; j < ready_.size() && !write.op.more; ++j)
      write.op.more = ready_[j].rail == write.rail;
    fabric::Transport& rail = fabric_.rail(write.rail);
    Status status = rail.write(write.op);
    if (status == Status::ok) {
      count_posted(write);
      continue;
    }
    if (status == Status::again) {
      // The rest waits, first in line, with its credits given back until it posts.
      for (size_t k = ready_.size(); k-- > i;) {
        credits_.release(ready_[k].op.peer, ready_[k].op.length);
        backlog_.push_front(ready_[k]);
        bump(counters_.backlogged);
      }
      return;
    }
    credits_.release(write.op.peer, write.op.length);
    finish_unposted(write, rail.last_error());
  }
}

// A write the provider refused for good: the failure is recorded, its position finishes.
int ProxyThread::failed_write_peer(std::optional<uint64_t> cookie) {
  if (!cookie) return -1;
  const auto lane_index = static_cast<size_t>(*cookie >> kCookiePositionBits);
  if (lane_index >= lanes_.size()) return -1;
  RingLane& lane = *lanes_[lane_index];
  const uint64_t position = lane.expand(*cookie, kCookiePositionBits);
  const RingLane::Entry* entry = lane.find(position);
  if (entry == nullptr) {  // finished already when its peer was given up
    auto abandoned = abandoned_writes_.find(*cookie);
    if (abandoned == abandoned_writes_.end()) return -1;
    const int dst = abandoned->second;
    abandoned_writes_.erase(abandoned);
    return dst;
  }
  const int dst = entry->dst;
  if (health_.tolerates_peer_failures()) {
    credits_.release(dst, entry->bytes);
    finish(lane_index, position);
  }
  return dst;
}

void ProxyThread::finish_unposted(const PendingWrite& write, const std::string& why) {
  fail("proxy.post", write.op.peer, fmt::format("rank {}: {}", config_.rank, why));
  finish_cookie(write.op.cookie);
}

void ProxyThread::finish(size_t lane_index, uint64_t position) {
  progressed_ = true;
  RingLane& lane = *lanes_[lane_index];
  if (lane.finish(position) != Status::ok)
    fail("proxy.retire", -1,
         fmt::format("rank {}: ring {} of proxy thread {}, position {} (popped {}, retired "
                     "{}): {}",
                     config_.rank, lane_index, config_.index, position, lane.popped(),
                     lane.retired(), lane.tracker_error()));
}

void ProxyThread::finish_cookie(uint64_t cookie) {
  size_t lane_index = static_cast<size_t>(cookie >> kCookiePositionBits);
  finish(lane_index, lanes_[lane_index]->expand(cookie, kCookiePositionBits));
}

}  // namespace proxyep::proxy
