// A proxy thread's lifecycle, its loop, idling and health checks. The data path (completions,
// descriptors -> writes, backlog, retirement) is in proxy_thread_data.cpp; design in the header.
#include "proxy/engine/proxy_thread.hpp"

#include "common/backoff.hpp"
#include "common/log.hpp"
#include "common/topology.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

namespace proxyep::proxy {
namespace {

constexpr uint64_t kHealthCheckPasses = 256;
constexpr int kCompletionBatch = 64;

bool is_power_of_two(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

}  // namespace

ProxyThread::ProxyThread(ThreadConfig config, fabric::Fabric& fabric, const RegionTable& regions,
                         control::ImmSink& sink, Health& health, WaiterSignals& signals)
    : config_(std::move(config)),
      fabric_(fabric),
      regions_(regions),
      sink_(sink),
      health_(health),
      signals_(signals),
      credits_(config_.ranks, config_.credits),
      backlog_(config_.ranks),
      idle_(config_.idle),
      last_progress_(static_cast<size_t>(config_.ranks)),
      dead_(static_cast<size_t>(config_.ranks), false),
      burst_(std::max<uint32_t>(config_.burst, 1)),
      completions_(kCompletionBatch),
      last_completion_ns_(std::make_unique<std::atomic<int64_t>[]>(
          static_cast<size_t>(std::max(config_.ranks, 1)))) {
  require(!config_.rails.empty(), "proxy.thread", "proxy thread {} has no rail", config_.index);
  require(is_power_of_two(config_.lane_window), "proxy.thread",
          "the ring window must be a power of two (got {})", config_.lane_window);
  ready_.reserve(burst_.size());
}

ProxyThread::~ProxyThread() {
  request_stop();
  join();
}

size_t ProxyThread::add_ring(gpu_side::Ring ring, const gpu_side::Doorbell* doorbell,
                             uint32_t window) {
  require(!thread_.joinable(), "proxy.thread", "rings must be added before the thread starts");
  require(lanes_.size() < (size_t{1} << (64 - kCookiePositionBits)), "proxy.thread",
          "too many rings on one thread");
  lanes_.push_back(std::make_unique<RingLane>(ring, doorbell, window));
  return lanes_.size() - 1;
}

void ProxyThread::start() {
  require(!thread_.joinable(), "proxy.thread", "proxy thread {} started twice", config_.index);
  thread_ = std::thread([this] { run(); });
}

void ProxyThread::request_stop() {
  stop_.store(true, std::memory_order_release);  // pairs with the acquire in run()
  kick();
}

void ProxyThread::join() {
  if (thread_.joinable()) thread_.join();
}

bool ProxyThread::join_until(const Deadline& deadline) {
  if (!thread_.joinable()) return true;
  // acquire: pairs with the release store at the end of run().
  while (!exited_.load(std::memory_order_acquire)) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
  return true;
}

void ProxyThread::abandon() {
  if (thread_.joinable()) thread_.detach();
}

ThreadStats ProxyThread::stats() const {
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  ThreadStats s;
  s.descriptors = get(counters_.descriptors);
  s.posted = get(counters_.posted);
  s.completed = get(counters_.completed);
  s.remote = get(counters_.remote);
  s.backlogged = get(counters_.backlogged);
  s.sleeps = get(counters_.sleeps);
  s.passes = get(counters_.passes);
  s.driven = get(counters_.driven);
  s.bytes_posted = get(counters_.bytes_posted);
  s.cq_errors = get(counters_.cq_errors);
  s.busy_ns = get(counters_.busy_ns);
  s.latency = counters_.latency.snapshot();
  s.last_completion_ns.resize(static_cast<size_t>(config_.ranks));
  for (int r = 0; r < config_.ranks; ++r)
    s.last_completion_ns[static_cast<size_t>(r)] =
        last_completion_ns_[static_cast<size_t>(r)].load(std::memory_order_relaxed);
  return s;
}

void ProxyThread::fail(const char* phase, int peer, std::string message) {
  health_.record(Failure{phase, peer, std::move(message)});
}

void ProxyThread::run() {
  tid_.store(static_cast<pid_t>(::syscall(SYS_gettid)), std::memory_order_release);
  if (!config_.pus.empty()) {
    try {
      if (!topology::pin_current_thread(config_.pus))
        log::warn("proxy thread {}: could not pin to CPUs {}; running unpinned", config_.index,
                  topology::format_cpu_list(config_.pus));
    } catch (const Error& e) {
      log::warn("proxy thread {}: pinning failed ({}); running unpinned", config_.index, e.what());
    }
  }
  // The doorbells this thread sleeps on: its own (engine kicks) and each ring's.
  poll_fds_.push_back({wake_.fd(), POLLIN, 0});
  for (const auto& lane : lanes_)
    if (lane->doorbell() != nullptr) poll_fds_.push_back({lane->doorbell()->fd(), POLLIN, 0});
  {
    std::lock_guard lock(pass_lock_);  // a waiter may drive as soon as the engine runs
    std::fill(last_progress_.begin(), last_progress_.end(), Clock::now());
  }

  // acquire: pairs with the release store in request_stop().
  while (!stop_.load(std::memory_order_acquire)) {
    bool worked = false, awake = false;
    {
      // Not taken: a driver is in a pass, doing this one's work.
      std::unique_lock lock(pass_lock_, std::try_to_lock);
      if (lock.owns_lock()) {
        worked = timed_pass();
        awake = keep_awake();
      }
    }
    const bool driven = signals_.driving.load(std::memory_order_relaxed) > 0;
    switch (idle_.after_pass(worked, awake, driven)) {
      case IdlePolicy::Step::spin:
        cpu_relax();
        break;
      case IdlePolicy::Step::yield:
        sched_yield();
        break;
      case IdlePolicy::Step::sleep:
        sleep();
        std::lock_guard lock(pass_lock_);
        check_health();
        break;
    }
  }
  exited_.store(true, std::memory_order_release);  // pairs with the acquire in join_until()
}

// Sleeping is for a thread with nothing to wait for: a waiter (in this process, or a daemon
// client that produces into one of the rings) depends on completions only polling finds, and
// writes in flight or waiting for credits complete only if their CQ is read (manual-progress
// providers) and their credits come back.
bool ProxyThread::keep_awake() const {
  if (signals_.waiting.load(std::memory_order_relaxed) > 0 ||
      signals_.polling.load(std::memory_order_relaxed) > 0 || !backlog_.empty())
    return true;
  for (const auto& lane : lanes_)
    if (lane->producer_waiting()) return true;  // a daemon client waits (ring_layout.hpp)
  return counters_.posted.load(std::memory_order_relaxed) !=
         counters_.completed.load(std::memory_order_relaxed);
}

bool ProxyThread::try_drive() {
  std::unique_lock lock(pass_lock_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bump(counters_.driven);
  return timed_pass();
}

std::unique_lock<std::mutex> ProxyThread::hold(const Deadline& deadline) {
  std::unique_lock lock(pass_lock_, std::try_to_lock);
  for (Backoff backoff; !lock.owns_lock() && !deadline.expired(); backoff.pause())
    (void)lock.try_lock();
  return lock;
}

bool ProxyThread::timed_pass() {
  const auto start = Clock::now();
  const bool worked = pass();
  if (worked) bump(counters_.busy_ns, static_cast<uint64_t>(ns_of(Clock::now()) - ns_of(start)));
  return worked;
}

bool ProxyThread::pass() {
  bool worked = drain_completions();
  if (!backlog_.empty()) worked |= post_backlog();
  for (size_t lane = 0; lane < lanes_.size(); ++lane)
    worked |= pop_and_post(lane);
  counters_.passes.store(++passes_, std::memory_order_relaxed);
  if (passes_ % kHealthCheckPasses == 0) check_health();
  // Flags, retired cursors or the health changed: wake sleeping waiters to re-check. (Posting
  // alone changes nothing a waiter can see.)
  bool failed_now = !failure_notified_ && health_.failed();
  if (progressed_ || failed_now) signals_.notifier.notify();
  failure_notified_ = failure_notified_ || failed_now;
  progressed_ = false;
  return worked;
}

void ProxyThread::give_up(int dst) {
  dead_[static_cast<size_t>(dst)] = true;
  backlog_.drop(dst, [this](const PendingWrite& write) { finish_cookie(write.op.cookie); });
  if (!health_.tolerates_peer_failures()) return;
  // Writes in flight to it may never complete: finish them now, so quiet() does not wait for a
  // peer given up (a completion that still comes matches no write and names only that peer).
  for (size_t lane_index = 0; lane_index < lanes_.size(); ++lane_index) {
    std::vector<uint64_t> positions;
    lanes_[lane_index]->for_each_live([&](uint64_t position, const RingLane::Entry& entry) {
      if (entry.dst == dst) positions.push_back(position);
    });
    for (uint64_t position : positions) {
      credits_.release(dst, lanes_[lane_index]->find(position)->bytes);
      finish(lane_index, position);
      abandoned_writes_[make_cookie(lane_index, position)] = dst;
    }
  }
}

void ProxyThread::check_health() {
  const auto now = Clock::now();
  for (int dst = 0; dst < config_.ranks; ++dst) {
    const auto& window = credits_.at(dst);
    if (dead_[static_cast<size_t>(dst)] || (window.idle() && !backlog_.has(dst))) continue;
    auto stalled = now - last_progress_[static_cast<size_t>(dst)];
    if (stalled < config_.peer_timeout) continue;
    size_t waiting = backlog_.queue(dst).size();
    fail("proxy.peer_timeout", dst,
         fmt::format("rank {}: rank {} made no progress for {} ms: {} writes ({} bytes) in flight "
                     "to it never completed, {} more waiting; is rank {} alive?",
                     config_.rank, dst,
                     std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count(),
                     window.writes_in_flight(), window.bytes_in_flight(), waiting, dst));
    give_up(dst);
  }
  // Peers failed elsewhere (a write's error, their departure): nothing more goes to them.
  if (health_.tolerates_peer_failures())
    for (int dst = 0; dst < config_.ranks; ++dst)
      if (!dead_[static_cast<size_t>(dst)] && health_.peer_failed(dst)) give_up(dst);
  for (size_t i = 0; i < lanes_.size(); ++i)
    if (lanes_[i]->consumer().health() != Status::ok)
      fail("proxy.ring", -1,
           fmt::format("rank {}: a producer of ring {} (proxy thread {}) died owing a reserved "
                       "slot; descriptors behind position {} are stuck",
                       config_.rank, i, config_.index, lanes_[i]->popped()));
}

// Blocks until a doorbell rings or idle.sleep_us passes. Every ring is told first (the Dekker
// handshake in gpu_side/doorbell.hpp), so a producer that publishes after the announcement
// kicks, and one that published before it makes announce_sleep() refuse.
// A driver may pop the rings meanwhile (the consumer side is used under pass_lock_ only): a
// descriptor it takes after the announcement merely wakes this thread early.
void ProxyThread::sleep() {
  size_t announced = 0;
  bool empty = true;
  std::unique_lock lock(pass_lock_);
  for (; announced < lanes_.size(); ++announced) {
    if (!lanes_[announced]->consumer().announce_sleep()) {
      empty = false;
      break;
    }
  }
  lock.unlock();
  if (empty && !stop_.load(std::memory_order_acquire)) {
    for (auto& fd : poll_fds_)
      fd.revents = 0;
    bump(counters_.sleeps);  // counted as it begins: "asleep now" for whoever watches
    timespec ts{static_cast<time_t>(config_.idle.sleep_us / 1000000),
                static_cast<long>(config_.idle.sleep_us % 1000000) * 1000};
    if (::ppoll(poll_fds_.data(), poll_fds_.size(), &ts, nullptr) > 0) {
      for (const auto& fd : poll_fds_) {
        uint64_t count = 0;
        if (fd.revents & POLLIN) (void)!::read(fd.fd, &count, sizeof(count));  // consume kicks
      }
    }
  }
  lock.lock();
  for (size_t i = 0; i < announced; ++i)
    lanes_[i]->consumer().end_sleep();
}

}  // namespace proxyep::proxy
