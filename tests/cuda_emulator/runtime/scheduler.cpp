// The fiber scheduler (scheduler.hpp). Fibers are contexts (context_switch.hpp) on pooled stacks
// with a guard page; the scheduler's own context is the stream worker's stack.
#include "runtime/scheduler.hpp"

#include "runtime/detector.hpp"
#include "runtime/global_shadow.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace cuemu {
namespace {

constexpr size_t kRedzone = 64;
// Static __shared__ bytes a block may declare here (the kernels declare a few hundred; a GPU allows
// 48 KiB, and a kernel that needs more is told so, not miscompared): the arena and its shadow are
// filled for every block, so their size is most of a block's start-up cost.
constexpr size_t kStaticShared = 8 * 1024;
constexpr size_t kMaxResident = 8;  // blocks resident before any waits

// Fiber stacks, kept for the next launch: a launch of 100k threads maps them once.
class StackPool {
 public:
  void* take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        void* stack = free_.back();
        free_.pop_back();
        return stack;
      }
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* base = mmap(nullptr, kFiberStackBytes + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    mprotect(base, page, PROT_NONE);  // the guard page: an overflow faults instead of corrupting
    return static_cast<char*>(base) + page;
  }
  void give(void* stack) {
    std::lock_guard lock(mutex_);
    free_.push_back(stack);
  }

 private:
  std::mutex mutex_;
  std::vector<void*> free_;
};
StackPool& stacks() {
  static StackPool pool;
  return pool;
}

// A small fast generator (xorshift64*, seeded through splitmix64): the scheduler draws one number
// per switch, where mt19937_64's state refills showed in profiles.
class Random {
 public:
  using result_type = uint64_t;
  explicit Random(uint64_t seed) {
    seed += 0x9e3779b97f4a7c15ull;
    seed = (seed ^ (seed >> 30)) * 0xbf58476d1ce4e5b9ull;
    seed = (seed ^ (seed >> 27)) * 0x94d049bb133111ebull;
    state_ = (seed ^ (seed >> 31)) | 1u;
  }
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }
  uint64_t operator()() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dull;
  }

 private:
  uint64_t state_;
};

// CUEMU_WATCHDOG_S (default 60): a launch still running after this long is a hang, reported
// and abandoned, as a GPU's watchdog would end it.
std::chrono::seconds watchdog() {
  static const std::chrono::seconds limit{[] {
    const char* text = std::getenv("CUEMU_WATCHDOG_S");
    return text != nullptr && *text != '\0' ? std::atoll(text) : 60ll;
  }()};
  return limit;
}

class Scheduler;
thread_local Scheduler* t_scheduler = nullptr;
thread_local Fiber* t_running = nullptr;

std::string where(const Fiber& f) {
  char text[160];
  std::snprintf(text, sizeof(text), "block (%u,%u,%u) thread (%u,%u,%u)", f.index.block_idx.x,
                f.index.block_idx.y, f.index.block_idx.z, f.index.thread_idx.x,
                f.index.thread_idx.y, f.index.thread_idx.z);
  return text;
}

class Scheduler {
 public:
  explicit Scheduler(const Grid& grid) : grid_(grid), random_(grid.seed) {
    for (unsigned z = 0; z < grid.grid.z; ++z)
      for (unsigned y = 0; y < grid.grid.y; ++y)
        for (unsigned x = 0; x < grid.grid.x; ++x)
          pending_.push_back(uint3{x, y, z});
    std::shuffle(pending_.begin(), pending_.end(), random_);
  }

  ~Scheduler() {
    for (Block* b : resident_)
      free_block(b);
    for (unsigned char* arena : spare_arenas_)
      std::free(arena);
  }

  void run() {
    while (next_pending_ < pending_.size() && resident_.size() < kMaxResident)
      admit();
    const auto started = std::chrono::steady_clock::now();
    uint64_t switches = 0;
    while (!resident_.empty() && !stopped_) {
      if ((++switches & 4095u) == 0 && std::chrono::steady_clock::now() - started > watchdog()) {
        report_fault("watchdog", "the launch ran longer than CUEMU_WATCHDOG_S (" +
                                     std::to_string(watchdog().count()) +
                                     " s): a thread waits for something that never comes");
        stopped_ = true;
        break;
      }
      if (runnable_.empty()) {
        deadlock();
        break;
      }
      Fiber* f = runnable_[random_() % runnable_.size()];
      switch_to(f);
      if (f->state == Fiber::State::done) {
        retire(f);
        continue;
      }
      if (!f->slept) {
        sleepers_in_a_row_ = 0;
        continue;
      }
      f->slept = false;
      // Every runnable fiber only sleeps (a poll): they wait for another block, the host or a
      // peer. Admit a block if one is left (a GPU would have it resident), else give the host
      // threads time.
      if (++sleepers_in_a_row_ > 2 * runnable_.size()) {
        sleepers_in_a_row_ = 0;
        if (next_pending_ < pending_.size())
          admit();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  void yield() {
    Fiber* f = t_running;
    switch_context(f->context, home_);
  }

  void park(Fiber* f) {
    remove_runnable(f);
    yield();
  }
  void wake(Fiber* f) {
    f->state = Fiber::State::runnable;
    add_runnable(f);
  }

  void barrier(Fiber* f, const char* file, int line) {
    Block& b = *f->block;
    if (b.arrived == 0) {
      b.barrier_file = file;
      b.barrier_line = line;
    } else if (line != b.barrier_line || std::strcmp(file, b.barrier_file) != 0) {
      report_fault("barrier", where(*f) + " waits at __syncthreads " + short_path(file) + ":" +
                                  std::to_string(line) + " while others wait at " +
                                  short_path(b.barrier_file) + ":" +
                                  std::to_string(b.barrier_line));
    }
    ++b.arrived;
    if (b.arrived == b.live) {
      release_barrier(b);
      yield();
      return;
    }
    f->state = Fiber::State::at_barrier;
    b.at_barrier.push_back(f);
    park(f);
  }

  unsigned ballot(Fiber* f, unsigned mask, bool predicate, const char* file, int line) {
    Block& b = *f->block;
    const int lane = f->tid % 32;
    Warp& w = b.warps[static_cast<size_t>(f->tid / 32)];
    const int lanes = std::min(32, b.threads - f->tid / 32 * 32);
    const unsigned present = lanes == 32 ? ~0u : (1u << lanes) - 1u;
    const auto site = [&] { return short_path(file) + ":" + std::to_string(line); };
    if ((mask >> lane & 1u) == 0)
      report_fault("ballot", where(*f) + " calls __ballot_sync at " + site() +
                                 " with a mask that leaves out its own lane");
    if ((mask & ~present) != 0) {
      report_fault("ballot", where(*f) + " calls __ballot_sync at " + site() +
                                 " with a mask naming lanes its warp does not have");
      mask &= present;
    }
    if (w.arrived == 0) {
      w.mask = mask;
      w.file = file;
      w.line = line;
    } else if (w.mask != mask) {
      report_fault("ballot", where(*f) + " calls __ballot_sync at " + site() +
                                 " with another mask than its warp's other lanes");
    }
    w.arrived |= 1u << lane;
    if (predicate) w.predicates |= 1u << lane;
    if ((w.arrived & w.mask) == w.mask) {
      const unsigned result = w.predicates & w.mask;
      for (Fiber* other : w.waiting) {
        other->ballot_result = result;
        wake(other);
      }
      w = Warp{};
      yield();
      return result;
    }
    f->state = Fiber::State::at_ballot;
    w.waiting.push_back(f);
    park(f);
    return f->ballot_result;
  }

  void* shared(Fiber* f, size_t bytes, size_t align, const char* name, const char* file, int line) {
    Block& b = *f->block;
    for (const SharedVariable& v : b.variables)
      if (v.line == line && std::strcmp(v.file, file) == 0) return b.arena + v.offset;
    size_t offset = (b.arena_used + align - 1) / align * align;
    if (offset + bytes + kRedzone > b.arena_bytes) {
      report_fault("shared", std::string("__shared__ ") + name + " (" + file + ":" +
                                 std::to_string(line) + ") exceeds the block's " +
                                 std::to_string(kStaticShared) + " static bytes");
      offset = kRedzone;  // somewhere in the arena, so the kernel can go on
    } else {
      b.arena_used = offset + bytes + kRedzone;
    }
    b.variables.push_back({name, file, line, offset, bytes});
    for (size_t i = offset / 4; i < (offset + bytes + 3) / 4; ++i)
      b.shadow[i].redzone = false;
    return b.arena + offset;
  }

  void* dynamic(Fiber* f, const char* name, const char* file, int line) {
    Block& b = *f->block;
    // The dynamic part is the first variable, placed at admission; named by its first use.
    SharedVariable& v = b.variables.front();
    if (v.name == nullptr) {
      v.name = name;
      v.file = file;
      v.line = line;
    }
    return b.arena + v.offset;
  }

  const Grid& grid() const { return grid_; }
  void stop() { stopped_ = true; }
  uint64_t next_random() { return random_(); }

 private:
  void switch_to(Fiber* f) {
    t_running = f;
    switch_context(home_, f->context);
    t_running = nullptr;
  }

  void add_runnable(Fiber* f) {
    f->runnable_slot = static_cast<int>(runnable_.size());
    runnable_.push_back(f);
  }
  void remove_runnable(Fiber* f) {
    if (f->runnable_slot < 0) return;
    Fiber* last = runnable_.back();
    runnable_[static_cast<size_t>(f->runnable_slot)] = last;
    last->runnable_slot = f->runnable_slot;
    runnable_.pop_back();
    f->runnable_slot = -1;
  }

  void release_barrier(Block& b) {
    b.arrived = 0;
    ++b.generation;
    for (Fiber* other : b.at_barrier)
      wake(other);
    b.at_barrier.clear();
  }

  static void fiber_main() {
    Scheduler* s = t_scheduler;
    try {
      s->grid_.body();  // the kernel: its accesses are checked
    } catch (const std::exception& e) {
      report_fault("exception", where(*t_running) + " threw: " + e.what());
    }
    t_running->state = Fiber::State::done;
    s->yield();  // never resumed
  }

  void admit() {
    auto* b = new Block;
    b->index = pending_[next_pending_++];
    b->linear = static_cast<int32_t>(b->index.x + b->index.y * grid_.grid.x +
                                     b->index.z * grid_.grid.x * grid_.grid.y);
    const dim3& d = grid_.block;
    b->threads = static_cast<int>(d.x * d.y * d.z);
    b->live = b->threads;
    b->warps.resize(static_cast<size_t>((b->threads + 31) / 32));
    // [red zone][dynamic shared][red zone][static variables, each followed by a red zone]
    const size_t dynamic = (grid_.shared_bytes + 15) / 16 * 16;
    b->arena_bytes = kRedzone + dynamic + kRedzone + kStaticShared + kRedzone;
    if (spare_arenas_.empty()) {
      b->arena = static_cast<unsigned char*>(std::aligned_alloc(64, b->arena_bytes));
    } else {  // a retired block's: every block of a launch has the same size
      b->arena = spare_arenas_.back();
      spare_arenas_.pop_back();
    }
    std::memset(b->arena, 0xcd, b->arena_bytes);  // what an unwritten shared word reads
    b->shadow.assign(b->arena_bytes / 4, SharedWord{});
    for (SharedWord& w : b->shadow)
      w.redzone = true;
    b->variables.push_back({nullptr, nullptr, 0, kRedzone, grid_.shared_bytes});
    for (size_t i = kRedzone / 4; i < (kRedzone + grid_.shared_bytes + 3) / 4; ++i)
      b->shadow[i].redzone = false;
    b->arena_used = kRedzone + dynamic + kRedzone;
    for (int tid = 0; tid < b->threads; ++tid) {
      auto* f = new Fiber;
      f->block = b;
      f->tid = tid;
      f->index.thread_idx = uint3{tid % d.x, tid / d.x % d.y, tid / (d.x * d.y)};
      f->index.block_idx = b->index;
      f->index.block_dim = grid_.block;
      f->index.grid_dim = grid_.grid;
      f->stack = stacks().take();
      make_context(f->context, f->stack, kFiberStackBytes, &Scheduler::fiber_main);
      b->fibers.push_back(f);
      add_runnable(f);
    }
    resident_.push_back(b);
  }

  void retire(Fiber* f) {
    remove_runnable(f);
    Block& b = *f->block;
    --b.live;
    if (b.arrived > 0 && b.arrived == b.live) release_barrier(b);
    if (b.live > 0) return;
    resident_.erase(std::find(resident_.begin(), resident_.end(), &b));
    free_block(&b);
    if (next_pending_ < pending_.size()) admit();
  }

  void free_block(Block* b) {
    for (Fiber* f : b->fibers) {
      stacks().give(f->stack);
      delete f;
    }
    spare_arenas_.push_back(b->arena);
    delete b;
  }

  void deadlock() {
    std::string detail = "no thread can run:";
    int listed = 0;
    for (Block* b : resident_)
      for (Fiber* f : b->fibers) {
        if (f->state == Fiber::State::done || listed++ >= 8) continue;
        detail += " " + where(*f) +
                  (f->state == Fiber::State::at_barrier
                       ? std::string(" at __syncthreads ") + short_path(b->barrier_file) + ":" +
                             std::to_string(b->barrier_line)
                       : std::string(" at __ballot_sync"));
        detail += ";";
      }
    report_fault("deadlock", detail);
    stopped_ = true;
  }

  const Grid& grid_;
  Random random_;
  std::vector<uint3> pending_;
  size_t next_pending_ = 0;
  std::vector<Block*> resident_;
  std::vector<unsigned char*> spare_arenas_;
  std::vector<Fiber*> runnable_;
  Context home_;
  size_t sleepers_in_a_row_ = 0;
  bool stopped_ = false;
};

}  // namespace

Fiber* running_fiber() {
  return t_running;
}

RuntimeSection::RuntimeSection() : fiber_(t_running), was_(false) {
  if (fiber_ != nullptr) was_ = std::exchange(fiber_->in_runtime, true);
}
RuntimeSection::~RuntimeSection() {
  if (fiber_ != nullptr) fiber_->in_runtime = was_;
}
const Grid* running_grid() {
  return t_scheduler != nullptr ? &t_scheduler->grid() : nullptr;
}

void end_running_launch() {
  if (t_scheduler != nullptr) t_scheduler->stop();
}

void yield_to_scheduler() {
  if (t_running != nullptr) t_scheduler->yield();
}

uint64_t base_seed() {
  static const uint64_t seed = [] {
    const char* text = std::getenv("CUEMU_SEED");
    return text != nullptr ? std::strtoull(text, nullptr, 0) : uint64_t{1};
  }();
  return seed;
}

thread_local GlobalShadow* t_global_shadow = nullptr;

GlobalShadow* global_shadow() {
  return t_global_shadow;
}

void run_grid(const Grid& grid) {
  GlobalShadow shadow;
  Scheduler scheduler(grid);
  t_scheduler = &scheduler;
  t_global_shadow = &shadow;
  scheduler.run();
  t_global_shadow = nullptr;
  t_scheduler = nullptr;
}

const ThreadIndex& current() {
  return t_running->index;
}

void syncthreads(const char* file, int line) {
  const RuntimeSection section;
  if (t_running != nullptr) t_scheduler->barrier(t_running, file, line);
}

unsigned ballot_sync(unsigned mask, bool predicate, const char* file, int line) {
  if (t_running == nullptr) return 0;
  const RuntimeSection section;
  return t_scheduler->ballot(t_running, mask, predicate, file, line);
}

void nanosleep(unsigned) {
  if (t_running == nullptr) return;
  t_running->slept = true;
  t_scheduler->yield();
}

void* block_shared(size_t bytes, size_t align, const char* name, const char* file, int line) {
  const RuntimeSection section;
  return t_scheduler->shared(t_running, bytes, align, name, file, line);
}

void* dynamic_shared(const char* name, const char* file, int line) {
  const RuntimeSection section;
  return t_scheduler->dynamic(t_running, name, file, line);
}

uint64_t globaltimer_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

uint64_t scheduler_random() {
  return t_scheduler->next_random();
}

}  // namespace cuemu
