// ProxyEngine: the proxy threads of one rank. It splits the rank's fabric rails among threads
// (placement.hpp: one thread per NIC domain by default, pinned near it), hands each thread its
// share of the descriptor rings, and gives consumers the two waits they need: quiet() (every
// write reserved before the call has completed locally) and wait_flag() (a counter flag of the
// ordering layer). Both keep a deadline and report the engine's recorded failure at once, so a
// dead peer surfaces as an error naming it, never as a hang.
//
//   ProxyEngine engine(*fabric, rank, world, router);        // router: the immediates' sink
//   engine.regions().add_local(0, *send_region);             // ... and add_remote() per peer
//   engine.add_ring(ring, &doorbell);
//   engine.start();
//   producer.push(descriptor, deadline);                      // any thread
//   engine.wait_flag(bank, epoch, key, deadline, "dispatch from rank 3");
//   engine.quiet(deadline);
//   engine.stop();                                            // or the destructor
//
// While the engine runs its threads own the fabric's rails: nobody else may call the rails or
// Fabric::progress() (a bootstrap's progress hook must be cleared before start()).
//
// Lifecycle: regions and rings are added before start() (the region table is frozen then: no
// registration while running, but inside amend(), which pauses every thread); start() once; stop()
// joins every thread (idempotent, also run by the destructor, bounded even for a thread stuck
// inside the provider). stop() does not wait for writes in flight: call quiet() first when they
// must land. stop() must not race with waits.
//
// Waits first drive the proxy threads themselves for up to proxy.wait_drive_us: the waiter runs
// each thread's passes (ProxyThread::try_drive()) while the threads sleep, so a latency-bound call
// (a low-latency decode step) neither waits for a sleeping proxy to wake on its doorbell nor for
// the futex hand-off back to the waiter. Then they poll briefly (proxy.wait_spin_us), then sleep
// on a futex that the proxy threads signal when a pass changed something a waiter can see
// (wait_notifier.hpp): a waiter does not steal the core its proxy needs. A timed-out wait also
// names proxy threads that made no pass at all during it (stuck inside a provider call).
//
// Driving and stuck providers: a driver takes a thread's pass lock only when it is free, so a
// thread stuck inside a provider call (holding it) never traps a waiter, which fails at its
// deadline as before. A driver could itself be the one that enters such a call; that hazard is
// a provider that blocks on memory shared with a peer (shm and a dead peer holding its lock), so
// by default (-1) transports that share memory with their peers are never driven.
//
// Concurrency: quiet(), wait_until(), wait_flag(), health(), stats() and kick() may be called
// from any number of threads while the engine runs. running_ is stored with release by
// start()/stop() and loaded with acquire by waits. The waiter signals (waiting, driving) are
// incremented/decremented with relaxed RMWs: the proxy threads read them only to decide how
// deeply to idle (a thread with a waiter that does not drive never sleeps on its doorbells), and
// each waiter kicks every thread's doorbell after incrementing `waiting` and after it stops
// driving (the eventfd write/read orders that hand-off).
#pragma once

#include "common/deadline.hpp"
#include "control/counter_bank.hpp"
#include "control/imm_sink.hpp"
#include "control/peer_watch.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/health.hpp"
#include "proxy/engine/placement.hpp"
#include "proxy/engine/proxy_thread.hpp"
#include "proxy/engine/region_table.hpp"
#include "proxy/engine/wait_notifier.hpp"

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

struct EngineOptions {
  PlacementOptions placement;
  uint32_t burst = 32;
  uint32_t ring_window = 4096;  // unfinished descriptors per ring
  IdleOptions idle;
  CreditLimits credits;
  std::chrono::milliseconds peer_timeout{30000};
  // Waiters run the threads' passes this long first; -1: 2 ms unless a rail shares memory.
  std::chrono::microseconds wait_drive{-1};
  std::chrono::microseconds wait_spin{50};  // then poll this long before they sleep
  // A protocol that carries on without lost ranks (rank masking): a failure that names a peer,
  // or a peer's departure, gives up that peer only (health.hpp) instead of failing the engine.
  bool tolerate_peer_failures = false;

  // Every field from the proxy.* parameters (common/params.hpp). Throws proxyep::Error for
  // values out of range.
  static EngineOptions from_params();
};

class ProxyEngine {
 public:
  // `rank`/`ranks`: this rank and the world size. The fabric and the sink (control/imm_sink.hpp:
  // the rank's SignalRouter, or the daemon's relay to it) must outlive the
  // engine. Throws proxyep::Error("proxy.engine") for bad options.
  ProxyEngine(fabric::Fabric& fabric, int rank, int ranks, control::ImmSink& sink,
              EngineOptions options = EngineOptions::from_params());
  ~ProxyEngine();
  ProxyEngine(const ProxyEngine&) = delete;
  ProxyEngine& operator=(const ProxyEngine&) = delete;

  RegionTable& regions() { return shared_->regions; }
  // Before start(): the engine becomes the ring's consumer (ring i goes to thread i mod T).
  // `doorbell` is the one the ring's producers kick (may be null: then the thread polls the ring
  // at least every proxy.idle_sleep_us when idle). Returns the ring's index.
  size_t add_ring(gpu_side::Ring ring, const gpu_side::Doorbell* doorbell = nullptr);

  void start();
  // Runs `change` while no proxy thread is in a pass (each thread's pass lock held: none uses
  // the rails, none translates), with the region table open to additions: what a running
  // engine's fabric (FI_THREAD_DOMAIN) and table take only when nobody else uses them, e.g.
  // memory registered for calls that start later and its regions. Waits up to `deadline` for
  // each thread's pass in progress; throws proxyep::Error("proxy.amend") naming a thread whose
  // pass did not end (stuck inside the provider), with nothing run. Before start(), or after
  // stop(), `change` just runs. Exceptions from `change` pass through (the table is frozen
  // again). Not concurrently with itself, start() or stop().
  void amend(const std::function<void()>& change, const Deadline& deadline);
  // Stops and joins every thread. A thread stuck inside a provider call (e.g. spinning on a
  // lock a dead peer held in shared memory) is given kStopTimeout, then reported (log and
  // health) and detached: it and the engine state it uses are leaked, never destroyed, so
  // stop() itself never hangs. Should it ever return from the provider, it touches the fabric
  // and sink once more: keep them alive in that case (the process is normally about to end).
  void stop() noexcept;
  static constexpr std::chrono::milliseconds kStopTimeout{3000};
  bool running() const { return running_.load(std::memory_order_acquire); }
  // True once stop() had to detach a thread. Such a thread may still touch the fabric, the
  // sink and whatever they reach (registered memory, counter banks, windows) whenever it
  // returns from the provider: their owner must then keep them alive for the rest of the
  // process (session.hpp does), never destroy them.
  bool abandoned() const;

  // Waits until every descriptor reserved in any ring before the call has completed locally.
  // "Reserved" is the ring's host producer head: a GPU producer keeps its head in device memory
  // (gpu_side/cuda), so descriptors it publishes are covered only once the proxy has popped
  // them.
  // Throws proxyep::Error: "proxy.quiet" on timeout (naming the rings and counts outstanding),
  // or the engine's recorded failure (its phase, naming the peer).
  void quiet(const Deadline& deadline);
  // Ring `ring`'s completed prefix: every descriptor before this ring position has completed
  // locally (its source memory may be reused). A sole producer that counts its pushes knows the
  // position of each (a pushed descriptor at position p is done once retired(ring) > p).
  uint64_t retired(size_t ring) const;
  // Waits until `ready()` holds; throws Error("proxy.wait", "<what> ...") on timeout, or the
  // engine's failure.
  void wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                  std::string_view what);
  // The same, with the timeout message made when it happens (e.g. naming the peers whose
  // signals are still missing).
  void wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                  const std::function<std::string()>& describe_timeout);
  // Waits for a counter flag of the ordering layer (CounterBank::ready(epoch, key)).
  void wait_flag(const control::CounterBank& bank, uint64_t epoch, uint32_t key,
                 const Deadline& deadline, std::string_view what);

  // Peers known to have left the job (the bootstrap's liveness, control/peer_watch.hpp): every
  // wait fails at once when one has, naming it, and the failure is kept in health(). Set before
  // start(); the watch must outlive the engine. Null: none.
  void watch_peers(const control::PeerWatch* watch) { peers_ = watch; }

  // While some caller keeps it on, the threads yield between empty passes instead of sleeping
  // (IdlePolicy's keep_awake): for producers that ring no doorbell and signals nobody waits for
  // on the engine, a graph's steps (step_link.hpp). Counted: every on needs its off.
  void keep_polling(bool on) {
    shared_->signals.polling.fetch_add(on ? 1 : -1, std::memory_order_relaxed);
    kick();
  }

  const Health& health() const { return shared_->health; }
  void kick() const;
  int threads() const { return static_cast<int>(threads_.size()); }
  std::vector<ThreadPlan> plans() const { return plans_; }
  // Kernel thread ids of the running proxy threads (0 until a thread has started).
  std::vector<pid_t> thread_ids() const;
  ThreadStats stats() const;  // summed over threads
  ThreadStats thread_stats(int thread) const {
    return threads_.at(static_cast<size_t>(thread))->stats();
  }
  // Every thread's counters with its CPU time (ThreadStats::cpu_ns, from the kernel), for
  // metrics; any thread while the engine lives.
  std::vector<ThreadStats> all_thread_stats() const;

 private:
  class WaiterScope;
  class DriverScope;
  // One pass of every thread whose pass lock is free; whether any did work.
  bool drive_threads();
  template <typename Ready>
  void wait(Ready&& ready, const Deadline& deadline, std::string_view phase,
            const std::function<std::string()>& describe_timeout);
  std::string stuck_threads(const std::vector<uint64_t>& passes_before) const;
  // Records a peer the watch reports gone as the engine's failure.
  void note_departed_peer();

  fabric::Fabric& fabric_;
  control::ImmSink& sink_;
  EngineOptions options_;
  // What the proxy threads reference, on the heap so that a thread stop() had to abandon keeps
  // valid memory: the destructor leaks it then (the fabric and sink are the caller's).
  struct Shared {
    Shared(int ranks, int rails) : regions(ranks, rails) {}
    RegionTable regions;
    Health health;
    WaiterSignals signals;
  };
  std::unique_ptr<Shared> shared_;
  std::vector<ThreadPlan> plans_;
  std::vector<std::unique_ptr<ProxyThread>> threads_;
  struct RingRef {
    size_t thread = 0;
    size_t lane = 0;
  };
  std::vector<RingRef> rings_;
  std::vector<bool> abandoned_;       // per thread: detached by stop(), leaked by the destructor
  std::atomic<bool> running_{false};  // release by start()/stop(), acquire by waits
  const control::PeerWatch* peers_ = nullptr;
  int ranks_ = 0;
  bool stopped_ = false;
};

}  // namespace proxyep::proxy
