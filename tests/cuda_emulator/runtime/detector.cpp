// The access checks (detector.hpp).
#include "runtime/detector.hpp"

#include "runtime/global_shadow.hpp"
#include "runtime/scheduler.hpp"

#include "cuemu/testing.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace cuemu {
namespace {

std::atomic<bool> g_faulted{false};
std::atomic<int> g_reports{0};
std::mutex g_kinds_mutex;
std::vector<std::string> g_kinds;  // for cuemu::testing::take_faults()
constexpr int kMaxReports = 20;

// Host-mapped ranges: a fixed table read without a lock by every hooked store; an entry is
// written before the count that publishes it, and a removed one is emptied in place.
struct Range {
  std::atomic<uintptr_t> begin{0}, end{0};
};
constexpr size_t kMaxRanges = 256;
std::array<Range, kMaxRanges> g_ranges;
std::atomic<size_t> g_range_count{0};
std::mutex g_range_mutex;

std::string fiber_name(const Fiber& f) {
  char text[120];
  std::snprintf(text, sizeof(text), "thread %d (%u,%u,%u) of block (%u,%u,%u)", f.tid,
                f.index.thread_idx.x, f.index.thread_idx.y, f.index.thread_idx.z,
                f.index.block_idx.x, f.index.block_idx.y, f.index.block_idx.z);
  return text;
}

std::string thread_name(const Block& b, int32_t tid) {
  if (tid == kMany) return "several threads";
  return fiber_name(*b.fibers[static_cast<size_t>(tid)]);
}

const SharedVariable* variable_at(const Block& b, size_t offset) {
  for (const SharedVariable& v : b.variables)
    if (offset >= v.offset && offset < v.offset + v.bytes) return &v;
  return nullptr;
}

std::string describe_shared(const Block& b, size_t offset) {
  const SharedVariable* v = variable_at(b, offset);
  if (v == nullptr) return "a red zone of shared memory at arena offset " + std::to_string(offset);
  return std::string("__shared__ ") + (v->name != nullptr ? v->name : "(dynamic)") + " (" +
         short_path(v->file) + ":" + std::to_string(v->line) + ") byte " +
         std::to_string(offset - v->offset);
}

void shared_access(Fiber& f, Block& b, size_t offset, size_t bytes, bool write, bool atomic) {
  const auto me = static_cast<int32_t>(f.tid);
  for (size_t i = offset / 4; i <= (offset + bytes - 1) / 4 && i < b.shadow.size(); ++i) {
    SharedWord& w = b.shadow[i];
    if (w.redzone) {
      report_fault("oob", fiber_name(f) + (write ? " writes " : " reads ") +
                              describe_shared(b, i * 4) +
                              ", outside every shared variable (nearest: " +
                              describe_shared(b, offset >= 4 ? offset - 4 : 0) + ")");
      return;
    }
    if (w.epoch != b.generation) {
      w.epoch = b.generation;
      w.writer = w.reader = w.atomic = -1;
    }
    const auto other = [me](int32_t who) { return who != -1 && who != me; };
    const char* conflict = nullptr;
    int32_t with = -1;
    if (atomic) {
      if (other(w.writer))
        conflict = "an atomic after another thread's plain write", with = w.writer;
      else if (other(w.reader))
        conflict = "an atomic after another thread's plain read", with = w.reader;
      w.atomic = (w.atomic == -1 || w.atomic == me) ? me : kMany;
      w.written = true;
    } else if (write) {
      if (other(w.writer))
        conflict = "a write after another thread's write", with = w.writer;
      else if (other(w.reader))
        conflict = "a write after another thread's read", with = w.reader;
      else if (other(w.atomic))
        conflict = "a plain write after another thread's atomic", with = w.atomic;
      w.writer = me;
      w.written = true;
    } else {
      if (!w.written)
        report_fault("uninit", fiber_name(f) + " reads " + describe_shared(b, i * 4) +
                                   ", which no thread of its block has written");
      if (other(w.writer))
        conflict = "a read after another thread's write", with = w.writer;
      else if (other(w.atomic))
        conflict = "a plain read after another thread's atomic", with = w.atomic;
      w.reader = (w.reader == -1 || w.reader == me) ? me : kMany;
    }
    if (conflict != nullptr) {
      report_fault("race", describe_shared(b, i * 4) + ": " + conflict +
                               " with no __syncthreads between: " + fiber_name(f) + " and " +
                               thread_name(b, with));
      return;
    }
  }
}

// Device memory (anything but the block's arena, host-mapped memory and the thread's own stack).
void global_access(Fiber& f, const void* address, size_t bytes, bool write, bool atomic) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  const auto stack = reinterpret_cast<uintptr_t>(f.stack);
  GlobalShadow* shadow = global_shadow();
  if (shadow == nullptr || (a >= stack && a < stack + kFiberStackBytes)) return;
  const char* conflict = shadow->access(f, a, bytes, write, atomic);
  if (conflict == nullptr) return;
  char where[128];
  std::snprintf(where, sizeof(where), "device memory at %p (%zu bytes, %s)", address, bytes,
                write ? "written" : "read");
  report_fault(
      "race", std::string(where) + ": " + conflict + ": " + fiber_name(f) +
                  (std::strstr(conflict, "block") == nullptr ? " (no __syncthreads between)" : ""));
}

bool releases(Order order) {
  return order == Order::release || order == Order::acq_rel || order == Order::seq_cst;
}
bool acquires(Order order) {
  return order == Order::acquire || order == Order::acq_rel || order == Order::seq_cst;
}

}  // namespace

std::string short_path(const char* file) {
  if (file == nullptr) return "?";
  const std::string path = file;
  const size_t at = path.rfind("gpu_side/");
  if (at != std::string::npos) return path.substr(at);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void report_fault(const char* kind, const std::string& detail) {
  const RuntimeSection section;
  g_faulted.store(true);
  end_running_launch();
  {
    std::lock_guard lock(g_kinds_mutex);
    g_kinds.emplace_back(kind);
  }
  if (g_reports.fetch_add(1) >= kMaxReports) return;
  const Grid* grid = running_grid();
  std::fprintf(stderr, "cuemu: %s: %s [kernel %s launched at %s:%d, launch %llu, seed %llu]\n",
               kind, detail.c_str(), grid != nullptr ? grid->site.kernel : "?",
               short_path(grid != nullptr ? grid->site.file : nullptr).c_str(),
               grid != nullptr ? grid->site.line : 0,
               grid != nullptr ? static_cast<unsigned long long>(grid->launch_number) : 0ull,
               grid != nullptr ? static_cast<unsigned long long>(grid->seed) : 0ull);
}

std::vector<std::string> testing::take_faults() {
  std::lock_guard lock(g_kinds_mutex);
  g_faulted.store(false);
  g_reports.store(0);
  return std::exchange(g_kinds, {});
}

cudaError_t sticky_error() {
  return g_faulted.load() ? cudaErrorLaunchFailure : cudaSuccess;
}

void add_host_mapped(const void* begin, size_t bytes) {
  std::lock_guard lock(g_range_mutex);
  const auto b = reinterpret_cast<uintptr_t>(begin);
  for (size_t i = 0; i < g_range_count.load(); ++i)
    if (g_ranges[i].begin.load() == g_ranges[i].end.load()) {
      g_ranges[i].begin.store(b);
      g_ranges[i].end.store(b + bytes);
      return;
    }
  const size_t i = g_range_count.load();
  if (i == kMaxRanges) return;  // unchecked beyond this many registrations, never wrong
  g_ranges[i].begin.store(b);
  g_ranges[i].end.store(b + bytes);
  g_range_count.store(i + 1);
}

void remove_host_mapped(const void* begin) {
  std::lock_guard lock(g_range_mutex);
  const auto b = reinterpret_cast<uintptr_t>(begin);
  for (size_t i = 0; i < g_range_count.load(); ++i)
    if (g_ranges[i].begin.load() == b) g_ranges[i].end.store(b);
}

bool is_host_mapped(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  const size_t count = g_range_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < count; ++i)
    if (a >= g_ranges[i].begin.load(std::memory_order_relaxed) &&
        a < g_ranges[i].end.load(std::memory_order_relaxed))
      return true;
  return false;
}

void on_access(const void* address, size_t bytes, bool write) {
  Fiber* f = running_fiber();
  if (f == nullptr || f->in_runtime || bytes == 0) return;
  // The checks' own string and vector work is not the kernel's (Fiber::in_runtime).
  f->in_runtime = true;
  struct Leave {
    Fiber* f;
    ~Leave() { f->in_runtime = false; }
  } leave{f};
  Block& b = *f->block;
  const size_t offset = static_cast<size_t>(static_cast<const unsigned char*>(address) - b.arena);
  if (offset < b.arena_bytes) {
    shared_access(*f, b, offset, bytes, write, false);
  } else if (!is_host_mapped(address)) {
    global_access(*f, address, bytes, write, false);
  } else if (write) {
    f->unfenced_host_store = true;
    const uintptr_t line = reinterpret_cast<uintptr_t>(address) & ~uintptr_t{63};
    for (uintptr_t released : f->released_lines)
      if (released == line) {
        report_fault("late-payload",
                     fiber_name(*f) + " stores into a 64-byte line of host memory it has " +
                         "already published with a release store (payload after seq)");
        break;
      }
  }
  // Now and then a plain access is a scheduling point too, so interleavings are not only those
  // the atomics and barriers allow.
  if (--f->accesses_to_preemption == 0) {
    f->accesses_to_preemption = 1 + static_cast<uint32_t>(scheduler_random() % 256);
    yield_to_scheduler();
  }
}

void on_atomic(const void* address, size_t bytes, Order order, bool writes) {
  Fiber* f = running_fiber();
  if (f == nullptr || f->in_runtime) return;
  f->in_runtime = true;
  struct Leave {
    Fiber* f;
    ~Leave() { f->in_runtime = false; }
  } leave{f};
  yield_to_scheduler();  // every atomic is a scheduling point
  Block& b = *f->block;
  const size_t offset = static_cast<size_t>(static_cast<const unsigned char*>(address) - b.arena);
  if (offset < b.arena_bytes) {
    shared_access(*f, b, offset, bytes, writes, true);
    return;
  }
  if (!is_host_mapped(address)) global_access(*f, address, bytes, true, true);
  if (acquires(order)) f->released_lines.clear();
  if (!writes || !releases(order) || !is_host_mapped(address)) return;
  if (f->unfenced_host_store)
    report_fault("unfenced",
                 fiber_name(*f) +
                     " makes a release store to host-mapped memory after plain stores " +
                     "to host memory with no __threadfence_system between");
  if (f->released_lines.size() == 16) f->released_lines.erase(f->released_lines.begin());
  f->released_lines.push_back(reinterpret_cast<uintptr_t>(address) & ~uintptr_t{63});
}

void on_fence() {
  Fiber* f = running_fiber();
  if (f == nullptr) return;
  f->unfenced_host_store = false;
  f->released_lines.clear();
}

void check_atomic_scope(const void* word, bool system_scope) {
  if (system_scope || running_fiber() == nullptr || !is_host_mapped(word)) return;
  const RuntimeSection section;
  report_fault("scope", fiber_name(*running_fiber()) +
                            " uses a device-scope atomic on host-mapped memory (the CPU is " +
                            "outside its scope)");
}

void threadfence_system() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  on_fence();
}

}  // namespace cuemu
