#include "proxy/engine/proxy_engine.hpp"

#include "proxy/engine/thread_cpu.hpp"

#include "common/backoff.hpp"
#include "common/keep_forever.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>

#include <algorithm>
#include <limits>
#include <thread>

namespace proxyep::proxy {
namespace {

constexpr const char* kPhase = "proxy.engine";
// A sleeping waiter re-checks at least this often: the bound for conditions no proxy pass
// signals (a predicate another thread makes true).
constexpr std::chrono::microseconds kMaxNap{1000};

// proxy.wait_drive_us = -1 where waiters may drive: long enough for a low-latency call's round
// trip, short enough that a waiter for a slow peer soon lets the proxy threads take over.
constexpr std::chrono::microseconds kAutoWaitDrive{2000};

// Waiters drive only transports whose progress calls cannot block on a peer: none that works
// through memory shared with its peers (capabilities.hpp).
bool no_rail_shares_memory(fabric::Fabric& fabric) {
  for (int r = 0; r < fabric.num_rails(); ++r)
    if (fabric.rail(r).capabilities().shared_memory) return false;
  return true;
}

template <typename T>
T checked(int64_t value, int64_t lo, const char* name) {
  require(value >= lo && (value < 0 || static_cast<uint64_t>(value) <=
                                           static_cast<uint64_t>(std::numeric_limits<T>::max())),
          kPhase, "{} = {} is out of range (at least {})", name, value, lo);
  return static_cast<T>(value);
}

bool is_power_of_two(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

}  // namespace

EngineOptions EngineOptions::from_params() {
  EngineOptions o;
  o.placement.threads = checked<int>(params::proxy_threads.get(), 0, "proxy.threads");
  o.placement.pin = params::proxy_pin.get();
  o.placement.cpus = params::proxy_cpus.get();
  o.burst = checked<uint32_t>(params::proxy_burst.get(), 1, "proxy.burst");
  o.idle.spin_passes = checked<uint32_t>(params::proxy_spin_passes.get(), 0, "proxy.spin_passes");
  o.idle.yield_passes =
      checked<uint32_t>(params::proxy_yield_passes.get(), 0, "proxy.yield_passes");
  o.idle.sleep_us = checked<uint32_t>(params::proxy_idle_sleep_us.get(), 1, "proxy.idle_sleep_us");
  o.credits.writes =
      checked<uint32_t>(params::proxy_credits_writes.get(), 1, "proxy.credits_writes");
  o.credits.bytes = checked<uint64_t>(params::proxy_credits_bytes.get(), 1, "proxy.credits_bytes");
  int64_t wait_spin = checked<int64_t>(params::proxy_wait_spin_us.get(), -1, "proxy.wait_spin_us");
  if (wait_spin < 0) wait_spin = std::thread::hardware_concurrency() >= 4 ? 50 : 0;
  o.wait_spin = std::chrono::microseconds(wait_spin);
  // -1 (auto) is resolved by the engine, which knows the transports.
  o.wait_drive = std::chrono::microseconds(
      checked<int64_t>(params::proxy_wait_drive_us.get(), -1, "proxy.wait_drive_us"));
  o.peer_timeout = std::chrono::milliseconds(
      checked<int64_t>(params::proxy_peer_timeout_ms.get(), 1, "proxy.peer_timeout_ms"));
  return o;
}

// Counts a waiter for the threads' idle policy and, unless it drives them itself, wakes them,
// so a sleeping proxy starts polling for the completions the waiter depends on.
class ProxyEngine::WaiterScope {
 public:
  WaiterScope(ProxyEngine& engine, bool driving) : engine_(engine) {
    engine_.shared_->signals.waiting.fetch_add(1, std::memory_order_relaxed);
    if (!driving) engine_.kick();
  }
  ~WaiterScope() { engine_.shared_->signals.waiting.fetch_sub(1, std::memory_order_relaxed); }
  WaiterScope(const WaiterScope&) = delete;
  WaiterScope& operator=(const WaiterScope&) = delete;

 private:
  ProxyEngine& engine_;
};

// Counts a driving waiter (the threads sleep meanwhile); when it stops driving, kicks the threads
// so they poll again: for writes in flight, and for the peers' writes to this rank, which
// manual-progress providers move only while the CQ is read (measured: leaving idle threads
// asleep instead made small low-latency calls slower).
class ProxyEngine::DriverScope {
 public:
  DriverScope(ProxyEngine& engine, bool drive) : engine_(engine), driving_(drive) {
    if (driving_) engine_.shared_->signals.driving.fetch_add(1, std::memory_order_relaxed);
  }
  ~DriverScope() { end(); }
  DriverScope(const DriverScope&) = delete;
  DriverScope& operator=(const DriverScope&) = delete;
  bool driving() const { return driving_; }
  void end() {
    if (!driving_) return;
    driving_ = false;
    engine_.shared_->signals.driving.fetch_sub(1, std::memory_order_relaxed);
    for (const auto& thread : engine_.threads_)
      thread->kick();
  }

 private:
  ProxyEngine& engine_;
  bool driving_;
};

ProxyEngine::ProxyEngine(fabric::Fabric& fabric, int rank, int ranks, control::ImmSink& sink,
                         EngineOptions options)
    : fabric_(fabric),
      sink_(sink),
      options_(std::move(options)),
      shared_(std::make_unique<Shared>(ranks, fabric.num_rails())),
      ranks_(ranks) {
  require(rank >= 0 && rank < ranks, kPhase, "rank {} is outside a world of {}", rank, ranks);
  require(is_power_of_two(options_.ring_window), kPhase,
          "the ring window must be a power of two (got {})", options_.ring_window);
  if (options_.tolerate_peer_failures) shared_->health.tolerate_peer_failures(ranks);
  const topology::Topology* topo = nullptr;
  if (options_.placement.pin && options_.placement.cpus.empty()) topo = &topology::discovered();
  plans_ = plan_threads(fabric_, options_.placement, topo);
  for (size_t t = 0; t < plans_.size(); ++t) {
    ThreadConfig config;
    config.index = static_cast<int>(t);
    config.rank = rank;
    config.ranks = ranks;
    config.rails = plans_[t].rails;
    config.pus = plans_[t].pus;
    config.burst = options_.burst;
    config.lane_window = options_.ring_window;
    config.idle = options_.idle;
    config.credits = options_.credits;
    config.peer_timeout = options_.peer_timeout;
    abandoned_.push_back(false);
    threads_.push_back(std::make_unique<ProxyThread>(config, fabric_, shared_->regions, sink_,
                                                     shared_->health, shared_->signals));
  }
  if (options_.wait_drive.count() < 0)
    options_.wait_drive =
        no_rail_shares_memory(fabric_) ? kAutoWaitDrive : std::chrono::microseconds(0);
}

ProxyEngine::~ProxyEngine() {
  stop();
  // A detached thread still uses its ProxyThread and the shared state: leak them.
  bool leak = false;
  for (size_t t = 0; t < threads_.size(); ++t) {
    if (!abandoned_[t]) continue;
    (void)keep_forever(std::move(threads_[t]));
    leak = true;
  }
  if (leak) (void)keep_forever(std::move(shared_));
}

bool ProxyEngine::abandoned() const {
  for (bool a : abandoned_)
    if (a) return true;
  return false;
}

size_t ProxyEngine::add_ring(gpu_side::Ring ring, const gpu_side::Doorbell* doorbell) {
  require(!running_ && !stopped_, kPhase, "rings must be added before start()");
  size_t thread = rings_.size() % threads_.size();
  size_t lane = threads_[thread]->add_ring(ring, doorbell, options_.ring_window);
  rings_.push_back({thread, lane});
  return rings_.size() - 1;
}

void ProxyEngine::start() {
  require(!running_ && !stopped_, kPhase, "the engine can be started once");
  shared_->regions.freeze();
  for (size_t t = 0; t < threads_.size(); ++t) {
    try {
      threads_[t]->start();
    } catch (const std::system_error& e) {
      stop();
      fail(kPhase, "could not start proxy thread {}: {}", t, e.what());
    }
    const ThreadPlan& plan = plans_[t];
    log::debug("proxy thread {}: rails {}, domain {}, cpus {}", t, fmt::join(plan.rails, ","),
               plan.domain, plan.pus.empty() ? "any" : topology::format_cpu_list(plan.pus));
  }
  running_.store(true, std::memory_order_release);
}

void ProxyEngine::stop() noexcept {
  for (auto& thread : threads_)
    thread->request_stop();
  const Deadline deadline(kStopTimeout);
  for (size_t t = 0; t < threads_.size(); ++t) {
    if (abandoned_[t] || threads_[t]->join_until(deadline)) continue;
    abandoned_[t] = true;
    threads_[t]->abandon();
    shared_->health.record(
        Failure{"proxy.stop", -1,
                fmt::format("proxy thread {} did not stop within {} ms: it is stuck "
                            "inside the provider (a dead peer holding a shared-memory "
                            "lock?); it is detached and leaked",
                            t, kStopTimeout.count())});
  }
  if (running_.exchange(false, std::memory_order_acq_rel)) stopped_ = true;
}

void ProxyEngine::amend(const std::function<void()>& change, const Deadline& deadline) {
  RegionTable& table = shared_->regions;
  std::vector<std::unique_lock<std::mutex>> held;
  if (running()) {
    held.reserve(threads_.size());
    for (size_t t = 0; t < threads_.size(); ++t) {
      held.push_back(threads_[t]->hold(deadline));
      require(held.back().owns_lock(), "proxy.amend",
              "proxy thread {} did not finish its pass in time (stuck inside the fabric "
              "provider?): nothing was changed",
              t);
    }
  }
  const bool was_frozen = table.frozen();
  table.thaw();
  try {
    change();
  } catch (...) {
    if (was_frozen) table.freeze();
    throw;
  }
  if (was_frozen) table.freeze();
}

void ProxyEngine::kick() const {
  for (const auto& thread : threads_)
    thread->kick();
}

std::vector<pid_t> ProxyEngine::thread_ids() const {
  std::vector<pid_t> ids;
  for (const auto& thread : threads_)
    ids.push_back(thread->tid());
  return ids;
}

ThreadStats ProxyEngine::stats() const {
  ThreadStats sum;
  for (const auto& thread : threads_) {
    ThreadStats s = thread->stats();
    sum.descriptors += s.descriptors;
    sum.posted += s.posted;
    sum.completed += s.completed;
    sum.remote += s.remote;
    sum.backlogged += s.backlogged;
    sum.sleeps += s.sleeps;
    sum.passes += s.passes;
    sum.driven += s.driven;
    sum.bytes_posted += s.bytes_posted;
    sum.cq_errors += s.cq_errors;
    sum.busy_ns += s.busy_ns;
    sum.latency.add(s.latency);
    sum.last_completion_ns.resize(s.last_completion_ns.size(), 0);
    for (size_t r = 0; r < s.last_completion_ns.size(); ++r)
      sum.last_completion_ns[r] = std::max(sum.last_completion_ns[r], s.last_completion_ns[r]);
  }
  return sum;
}

template <typename Ready>
void ProxyEngine::wait(Ready&& ready, const Deadline& deadline, std::string_view phase,
                       const std::function<std::string()>& describe_timeout) {
  require(running_.load(std::memory_order_acquire), std::string(phase),
          "the proxy engine is not running");
  const bool drive = options_.wait_drive.count() > 0;
  WaiterScope scope(*this, drive);
  std::vector<uint64_t> passes_before;
  for (const auto& thread : threads_)
    passes_before.push_back(thread->stats().passes);
  // Drive the threads for wait_drive (yielding the core after a pass that found nothing), then
  // poll (yielding: the proxy this waits for may share the core) for wait_spin, then sleep until
  // a proxy pass signals progress.
  DriverScope driver(*this, drive);
  const auto drive_end = Deadline::Clock::now() + options_.wait_drive;
  const auto spin_end = drive_end + options_.wait_spin;
  while (!ready()) {
    note_departed_peer();
    shared_->health.throw_if_failed();
    if (deadline.expired())
      fail(std::string(phase), "{}{}", describe_timeout(), stuck_threads(passes_before));
    if (driver.driving()) {
      if (Deadline::Clock::now() < drive_end) {
        if (!drive_threads()) sched_yield();
        continue;
      }
      driver.end();
    }
    if (Deadline::Clock::now() < spin_end) {
      sched_yield();
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.end() -
                                                                      Deadline::Clock::now());
    auto nap = std::clamp(left, std::chrono::microseconds(1), kMaxNap);
    shared_->signals.notifier.sleep(nap, [&] { return !ready() && !shared_->health.failed(); });
    // (A departed peer is noticed at the next turn: naps last at most kMaxNap.)
  }
  // A failure recorded while the condition came true is still reported: the data the caller is
  // about to use may be incomplete (e.g. a write to a dead peer was dropped).
  shared_->health.throw_if_failed();
}

bool ProxyEngine::drive_threads() {
  bool worked = false;
  for (const auto& thread : threads_)
    worked |= thread->try_drive();
  return worked;
}

void ProxyEngine::note_departed_peer() {
  if (peers_ == nullptr) return;
  auto gone = peers_->failure();
  if (!gone) return;
  Health& health = shared_->health;
  if (!health.tolerates_peer_failures()) {
    health.record(Failure{"proxy.peer", gone->rank,
                          fmt::format("rank {} left the job: {}", gone->rank, gone->reason)});
    return;
  }
  // Every departed rank is given up, each on its own (the first failure names only one).
  for (int rank = 0; rank < ranks_; ++rank)
    if (!health.peer_failed(rank) && peers_->departed(rank))
      health.record(Failure{"proxy.peer", rank, fmt::format("rank {} left the job", rank)});
}

// Threads that made no loop pass during a whole wait are stuck inside a provider call.
std::string ProxyEngine::stuck_threads(const std::vector<uint64_t>& passes_before) const {
  std::string stuck;
  for (size_t t = 0; t < threads_.size(); ++t)
    if (threads_[t]->stats().passes == passes_before[t])
      stuck += fmt::format("{}{}", stuck.empty() ? "" : ", ", t);
  if (stuck.empty()) return "";
  return fmt::format(
      "; proxy thread(s) {} made no progress at all during the wait (stuck inside "
      "the provider?)",
      stuck);
}

void ProxyEngine::quiet(const Deadline& deadline) {
  std::vector<uint64_t> targets;
  for (const RingRef& ref : rings_)
    targets.push_back(threads_[ref.thread]->lane(ref.lane).reserved());
  auto done = [&] {
    for (size_t r = 0; r < rings_.size(); ++r)
      if (threads_[rings_[r].thread]->lane(rings_[r].lane).retired() < targets[r]) return false;
    return true;
  };
  auto describe = [&] {
    std::string rings;
    for (size_t r = 0; r < rings_.size(); ++r) {
      const RingLane& lane = threads_[rings_[r].thread]->lane(rings_[r].lane);
      uint64_t left = lane.outstanding(targets[r]);
      if (left == 0) continue;
      rings += fmt::format(
          "{}ring {} (thread {}): {} of the descriptors before position {} "
          "unfinished, {} not even popped",
          rings.empty() ? "" : "; ", r, rings_[r].thread, left, targets[r],
          targets[r] > lane.popped_published() ? targets[r] - lane.popped_published() : 0);
    }
    return fmt::format("writes still outstanding at the deadline: {}", rings);
  };
  wait(done, deadline, "proxy.quiet", describe);
}

uint64_t ProxyEngine::retired(size_t ring) const {
  const RingRef& ref = rings_.at(ring);
  return threads_[ref.thread]->lane(ref.lane).retired();
}

void ProxyEngine::wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                             std::string_view what) {
  wait(ready, deadline, "proxy.wait",
       [&] { return fmt::format("{}: not reached by the deadline", what); });
}

void ProxyEngine::wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                             const std::function<std::string()>& describe_timeout) {
  wait(ready, deadline, "proxy.wait", describe_timeout);
}

void ProxyEngine::wait_flag(const control::CounterBank& bank, uint64_t epoch, uint32_t key,
                            const Deadline& deadline, std::string_view what) {
  wait([&] { return bank.ready(epoch, key); }, deadline, "proxy.wait",
       [&] {
         return fmt::format("{}: flag of key {} (epoch {}) not raised by the deadline{}", what, key,
                            epoch,
                            bank.last_error().empty() ? "" : "; counters: " + bank.last_error());
       });
}

std::vector<ThreadStats> ProxyEngine::all_thread_stats() const {
  std::vector<ThreadStats> stats;
  const std::vector<pid_t> tids = thread_ids();
  for (int t = 0; t < threads(); ++t) {
    ThreadStats s = thread_stats(t);
    if (const pid_t tid = tids[static_cast<size_t>(t)]; tid != 0)
      if (auto seconds = thread_cpu_seconds(tid)) s.cpu_ns = static_cast<uint64_t>(*seconds * 1e9);
    stats.push_back(std::move(s));
  }
  return stats;
}

}  // namespace proxyep::proxy
