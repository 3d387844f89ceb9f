// ProxyThread: one thread that drains descriptor rings into RMA writes on the fabric rails it
// owns. It owns those rails exclusively (the domain is FI_THREAD_DOMAIN: no other thread may
// touch them, Fabric::progress() included, while the thread runs).
//
// Each pass (NCCL's progress loop shape, one step per concern):
//   1. completions: read every rail's CQ. A local completion returns its credits and finishes
//      its ring position (RingLane retires positions in order); a remote completion (an incoming
//      write landed) goes to the ordering layer's SignalRouter (counters, sequence windows,
//      credits), which any number of proxy threads may call at once.
//   2. backlog: post writes that were waiting for credits or for the provider, oldest first.
//   3. rings: pop a burst from each ring, decode and validate every descriptor, translate it
//      through the RegionTable, take credits, and post the burst with FI_MORE on all but the last
//      write per rail. A write that cannot go now waits in the backlog, never back in the ring.
//   4. every few hundred passes (and after each sleep): peer timeouts and ring health.
// Then the IdlePolicy decides: spin, yield, or sleep until a ring's doorbell or the engine kicks.
//
// A waiting caller may run passes in the thread's place (try_drive(); ProxyEngine's drive
// window): the caller is awake anyway, and a pass it runs itself sees its completion without a
// hand-off, and posts descriptors without waking a sleeping thread. Each pass, the thread's or a
// driver's, holds pass_lock_, which serialises every use of the rails (FI_THREAD_DOMAIN) and of
// the thread's state; while a driver is present the thread sleeps instead of polling beside it.
//
// Errors never stop the thread and never crash it: they are recorded in the engine's Health
// (phase + peer + message) and every waiter sees them. A destination declared failed (no
// progress within peer_timeout) gets no more writes: its backlog and later descriptors are
// dropped (their ring positions finish so the thread does not stall on them).
//
// Cross-thread state and memory orders:
// - stop_: release store by request_stop(), acquire load at the top of each pass.
// - tid_: release store by the thread once running, acquire load by tid() (CPU accounting).
// - exited_: release store as run() returns, acquire load by join_until(): a bounded stop.
// - WaiterSignals::waiting and ::driving (engine-owned): relaxed loads; they only decide how
//   deep to idle, and a waiter also kicks the thread's doorbell (as it arrives and as it stops
//   driving), whose eventfd write/read orders everything that matters.
// - pass_lock_: everything a pass touches (rails, lanes' consumer side, credits, backlog,
//   progress times) is used only with it held, by the thread or by one driver at a time.
// - stats counters: written by this thread only, relaxed; read relaxed by anyone (monitoring).
// - RingLane::retired (ring_lane.hpp), Health (health.hpp) and the WaitNotifier that wakes
//   sleeping waiters after a pass that routed a completion, finished a position or saw the
//   first failure (wait_notifier.hpp) carry their own pairings.
// - A CQ error fails a write that then never returns its credits: its destination stalls and
//   the peer timeout names it as well; the thread also stops sleeping (writes in flight).
#pragma once

#include "common/deadline.hpp"
#include "control/imm_sink.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/backlog.hpp"
#include "proxy/engine/credit_window.hpp"
#include "proxy/engine/health.hpp"
#include "proxy/engine/idle_policy.hpp"
#include "proxy/engine/latency_histogram.hpp"
#include "proxy/engine/region_table.hpp"
#include "proxy/engine/ring_lane.hpp"
#include "proxy/engine/wait_notifier.hpp"

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

struct pollfd;

namespace proxyep::proxy {

struct ThreadConfig {
  int index = 0;                // thread number within the engine
  int rank = 0;                 // this rank
  int ranks = 1;                // world size
  std::vector<int> rails;       // fabric rail indices this thread owns
  std::vector<int> pus;         // pin to these CPUs; empty = unpinned
  uint32_t burst = 32;          // descriptors popped per ring per pass
  uint32_t lane_window = 4096;  // unfinished descriptors per ring (power of two)
  IdleOptions idle;
  CreditLimits credits;
  std::chrono::milliseconds peer_timeout{30000};
};

// What the engine's waiters tell its proxy threads (engine-owned; outlives the threads).
struct WaiterSignals {
  std::atomic<int> waiting{0};  // threads waiting on the engine: keep polling for them
  std::atomic<int> driving{0};  // of them, those running passes themselves: sleep, not poll
  // Producers that ring no doorbell and consumers that wait on no engine (a graph's steps,
  // ProxyEngine::keep_polling): while > 0 the threads yield between empty passes, never sleep.
  std::atomic<int> polling{0};
  WaitNotifier notifier;  // woken after a pass that changed what waiters can see
};

struct ThreadStats {
  uint64_t descriptors = 0;   // popped from rings
  uint64_t posted = 0;        // writes accepted by the provider
  uint64_t completed = 0;     // local completions
  uint64_t remote = 0;        // remote completions routed
  uint64_t backlogged = 0;    // writes that had to wait in the backlog
  uint64_t sleeps = 0;        // times the thread blocked on its doorbells
  uint64_t passes = 0;        // loop passes: a heartbeat (a thread stuck in the provider stops)
  uint64_t driven = 0;        // of them, passes a waiting caller ran (try_drive())
  uint64_t bytes_posted = 0;  // payload of the writes posted
  uint64_t cq_errors = 0;     // error completions read from the rails' CQs
  uint64_t busy_ns = 0;       // time in passes that did work (posted, completed or routed)
  // CPU time the thread used (the kernel's count, in clock ticks; 0 if unknown). Filled only
  // by Session::proxy_thread_stats(): reading it costs a file read.
  uint64_t cpu_ns = 0;
  LatencyHistogram::Snapshot latency;  // post -> local completion, per write
  // Per destination rank: steady_clock time (ns since its epoch) of the last local completion
  // of a write to it; 0: none yet. Engine sums take the latest over threads.
  std::vector<int64_t> last_completion_ns;
};

class ProxyThread {
 public:
  ProxyThread(ThreadConfig config, fabric::Fabric& fabric, const RegionTable& regions,
              control::ImmSink& sink, Health& health, WaiterSignals& signals);
  ~ProxyThread();  // joins
  ProxyThread(const ProxyThread&) = delete;
  ProxyThread& operator=(const ProxyThread&) = delete;

  // Before start(): this thread becomes the ring's consumer. Returns the lane index.
  size_t add_ring(gpu_side::Ring ring, const gpu_side::Doorbell* doorbell, uint32_t window);
  void start();
  void request_stop();
  void join();
  // Joins once the thread has left its loop, waiting until `deadline`; false when it has not (it
  // is stuck inside a provider call, e.g. on a lock a dead peer held in shared memory).
  bool join_until(const Deadline& deadline);
  // Gives up on a stuck thread: detaches it. The object must then be leaked, never destroyed.
  void abandon();
  // Wakes the thread if it sleeps (any thread).
  void kick() const noexcept { wake_.kick(); }
  // A waiting caller runs one pass in the thread's place (any thread, once started). Returns
  // whether the pass did work; false also when the thread or another driver is in a pass.
  bool try_drive();
  // Holds the pass lock (no pass, no use of the rails until it is dropped), waiting for the pass
  // in progress up to `deadline`; an unlocked lock when that pass did not end by then (the
  // thread is stuck inside a provider call).
  std::unique_lock<std::mutex> hold(const Deadline& deadline);

  size_t lanes() const { return lanes_.size(); }
  const RingLane& lane(size_t index) const { return *lanes_[index]; }
  pid_t tid() const { return tid_.load(std::memory_order_acquire); }
  ThreadStats stats() const;
  const ThreadConfig& config() const { return config_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Counters {
    std::atomic<uint64_t> descriptors{0}, posted{0}, completed{0}, remote{0}, backlogged{0},
        sleeps{0}, passes{0}, driven{0}, bytes_posted{0}, cq_errors{0}, busy_ns{0};
    LatencyHistogram latency;
  };

  void run();
  bool pass();
  // pass(), its time counted as busy when it did work.
  bool timed_pass();
  // A write the provider accepted: counted (posted, bytes).
  void count_posted(const PendingWrite& write) {
    bump(counters_.posted);
    bump(counters_.bytes_posted, write.op.length);
  }
  bool keep_awake() const;  // with pass_lock_ held
  bool drain_completions();
  void on_local_completion(const fabric::Completion& completion);
  bool post_backlog();
  bool pop_and_post(size_t lane_index);
  // `now`: when the burst was popped (one clock read per burst; its writes post right after).
  void admit(size_t lane_index, uint64_t position, const gpu_side::WireDescriptor& wire,
             Clock::time_point now);
  void post_ready();
  // The destination of the write with `cookie` (a transport's failed write), or -1. With peer
  // failures tolerated, the write is also finished (credits back, position retired).
  int failed_write_peer(std::optional<uint64_t> cookie);
  // Nothing more goes to `dst`: its backlog is dropped and later descriptors to it finish at once.
  void give_up(int dst);
  void finish_unposted(const PendingWrite& write, const std::string& why);
  void finish(size_t lane, uint64_t position);
  void finish_cookie(uint64_t cookie);
  void check_health();
  void sleep();
  void fail(const char* phase, int peer, std::string message);
  void touch(int dst, Clock::time_point now) { last_progress_[static_cast<size_t>(dst)] = now; }
  static int64_t ns_of(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  static void bump(std::atomic<uint64_t>& counter, uint64_t by = 1) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  ThreadConfig config_;
  fabric::Fabric& fabric_;
  const RegionTable& regions_;
  control::ImmSink& sink_;
  Health& health_;
  WaiterSignals& signals_;
  gpu_side::Doorbell wake_;  // engine kicks: stop, waiters
  std::mutex pass_lock_;     // held for every pass and health check (header comment)

  std::vector<std::unique_ptr<RingLane>> lanes_;
  CreditWindows credits_;
  Backlog backlog_;
  IdlePolicy idle_;
  std::vector<Clock::time_point> last_progress_;  // per destination: last completion or start
  std::vector<bool> dead_;                        // destinations declared failed
  // Cookies of writes finished when their peer was given up, to name that peer if their
  // error completion still comes (peer failures tolerated only).
  std::unordered_map<uint64_t, int> abandoned_writes_;
  std::vector<gpu_side::WireDescriptor> burst_;
  std::vector<PendingWrite> ready_;
  std::vector<fabric::Completion> completions_;
  std::vector<pollfd> poll_fds_;
  uint64_t passes_ = 0;
  bool progressed_ = false;        // this pass routed a completion or finished a position
  bool failure_notified_ = false;  // waiters were woken for the recorded failure
  size_t next_rail_ = 0;

  Counters counters_;
  // Per destination: ns_of() the last local completion of a write to it (0: none), for stats().
  std::unique_ptr<std::atomic<int64_t>[]> last_completion_ns_;
  std::atomic<bool> stop_{false};    // release by request_stop(), acquire in run()
  std::atomic<pid_t> tid_{0};        // release by run(), acquire by tid()
  std::atomic<bool> exited_{false};  // release when run() returns, acquire in join_until()
  std::thread thread_;
};

// Cookie of a posted write: lane index and ring position, so a local completion finds its entry.
constexpr uint64_t kCookiePositionBits = 48;
constexpr uint64_t make_cookie(size_t lane, uint64_t position) {
  return (static_cast<uint64_t>(lane) << kCookiePositionBits) |
         (position & ((uint64_t{1} << kCookiePositionBits) - 1));
}

}  // namespace proxyep::proxy
