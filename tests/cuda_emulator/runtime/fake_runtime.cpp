// The CUDA runtime as the emulator fakes it (cuda_runtime_api.h's cuemu::rt): one device whose
// memory is host memory, streams that are worker threads running their queues in order, and the
// launch that queues a grid for the scheduler. Errors follow CUDA: a launch's configuration error
// waits for cudaGetLastError(); a fault inside a kernel is sticky and every later
// synchronisation returns cudaErrorLaunchFailure. The stream type and what fake_driver.cpp (events,
// capture, graphs, IPC) shares with this file are in fake_stream.hpp.
#include "runtime/detector.hpp"
#include "runtime/fake_stream.hpp"
#include "runtime/scheduler.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace cuemu {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

struct State {
  std::mutex mutex;
  std::map<uintptr_t, DeviceAllocation> device_allocations;
  std::set<CUstream_st*> streams;
  std::set<std::string> kernels_ran;
  uint64_t launches = 0;
};
State& state() {
  static State s;
  return s;
}
CUstream_st& legacy_stream() {
  static CUstream_st* s = new CUstream_st;  // never destroyed: its worker outlives static teardown
  return *s;
}

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::atoi(text) : fallback;
}

// CUEMU_RAN_DIR: each kernel's first launch in this process appends "file:kernel" to its
// kernels.txt, for the check that every __global__ function ran (check_kernels_ran.sh).
void note_kernel_ran(const LaunchSite& site) {
  {
    std::lock_guard lock(state().mutex);
    if (!state().kernels_ran.insert(site.kernel).second) return;
  }
  const char* dir = std::getenv("CUEMU_RAN_DIR");
  if (dir == nullptr || *dir == '\0') return;
  (void)::mkdir(dir, 0755);  // the first test after the record was emptied makes it
  const std::string path = std::string(dir) + "/kernels.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  const char* file = std::strrchr(site.file, '/');
  const std::string line =
      std::string(file != nullptr ? file + 1 : site.file) + ":" + site.kernel + "\n";
  (void)::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace

CUstream_st& resolve(cudaStream_t stream) {
  return stream != nullptr ? *stream : legacy_stream();
}

cudaError_t fail(cudaError_t status) {
  t_last_error = status;
  return status;
}

void drain_all_streams() {
  legacy_stream().drain();
  std::set<CUstream_st*> streams;
  {
    std::lock_guard lock(state().mutex);
    streams = state().streams;
  }
  for (CUstream_st* s : streams)
    s->drain();
}

bool find_device_allocation(const void* address, DeviceAllocation* found) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  std::lock_guard lock(state().mutex);
  auto it = state().device_allocations.upper_bound(a);
  if (it == state().device_allocations.begin()) return false;
  --it;
  // An allocation of 0 bytes still owns its first byte's address.
  if (a >= it->first + std::max<size_t>(it->second.bytes, 1)) return false;
  if (found != nullptr) *found = it->second;
  return true;
}

cudaError_t allocate_device(void** pointer, size_t bytes, bool pooled) {
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0, rounded == 0 ? 256 : rounded);
  {
    std::lock_guard lock(state().mutex);
    state().device_allocations[reinterpret_cast<uintptr_t>(p)] = {p, bytes, pooled};
  }
  *pointer = p;
  return cudaSuccess;
}

bool release_device(void* pointer) {
  {
    std::lock_guard lock(state().mutex);
    if (state().device_allocations.erase(reinterpret_cast<uintptr_t>(pointer)) == 0) return false;
  }
  std::free(pointer);
  return true;
}

void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64 ||
      shared_bytes > 48 * 1024) {
    t_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  note_kernel_ran(site);
  auto g = std::make_shared<Grid>();
  g->site = site;
  g->grid = grid;
  g->block = block;
  g->shared_bytes = shared_bytes;
  {
    std::lock_guard lock(state().mutex);
    g->launch_number = ++state().launches;
  }
  g->seed = base_seed() * 0x9e3779b97f4a7c15ull + g->launch_number;
  g->body = std::move(body);
  // A launch into an invalidated capture fails as CUDA's does. A recorded one runs at every
  // launch of the graph: each run after the first as a launch of its own (its own number and
  // seed), so replays try other interleavings.
  auto runs = std::make_shared<std::atomic<uint64_t>>(0);
  const cudaError_t queued = resolve(stream).push([g, runs] {
    if (runs->fetch_add(1) == 0) return run_grid(*g);
    Grid replay = *g;
    {
      std::lock_guard lock(state().mutex);
      replay.launch_number = ++state().launches;
    }
    replay.seed = base_seed() * 0x9e3779b97f4a7c15ull + replay.launch_number;
    run_grid(replay);
  });
  if (queued != cudaSuccess) t_last_error = queued;
}

namespace rt {

cudaError_t get_last_error(bool clear) {
  const cudaError_t status = t_last_error != cudaSuccess ? t_last_error : sticky_error();
  if (clear) t_last_error = cudaSuccess;
  return status;
}

const char* error_name(cudaError_t status) {
  switch (status) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorSymbolNotFound:
      return "cudaErrorSymbolNotFound";
    case cudaErrorPeerAccessAlreadyEnabled:
      return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorPeerAccessNotEnabled:
      return "cudaErrorPeerAccessNotEnabled";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge:
      return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureWrongThread:
      return "cudaErrorStreamCaptureWrongThread";
    default:
      return "cudaErrorUnknown";
  }
}

const char* error_string(cudaError_t status) {
  switch (status) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (the CUDA emulator reported a fault: see its cuemu: line)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined:
      return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    default:
      return error_name(status);
  }
}

cudaError_t malloc_device(void** pointer, size_t bytes) {
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  return allocate_device(pointer, bytes, false);
}

cudaError_t free_device(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  drain_all_streams();  // cudaFree waits for the device, as CUDA's does
  if (!find_device_allocation(pointer, nullptr)) return fail(cudaErrorInvalidValue);
  if (!release_device(pointer)) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t malloc_host(void** pointer, size_t bytes) {
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0, rounded == 0 ? 4096 : rounded);
  add_host_mapped(p, bytes);
  *pointer = p;
  return cudaSuccess;
}

cudaError_t free_host(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  remove_host_mapped(pointer);
  std::free(pointer);
  return cudaSuccess;
}

cudaError_t host_register(void* pointer, size_t bytes) {
  if (pointer == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  add_host_mapped(pointer, bytes);
  return cudaSuccess;
}

cudaError_t host_unregister(void* pointer) {
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  remove_host_mapped(pointer);
  return cudaSuccess;
}

cudaError_t host_device_pointer(void** device, void* host) {
  if (device == nullptr || host == nullptr) return fail(cudaErrorInvalidValue);
  *device = host;  // one address space, as with unified addressing
  return cudaSuccess;
}

cudaError_t memcpy_sync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection);
  const cudaError_t status = device_synchronize();
  if (status != cudaSuccess) return status;
  if (bytes > 0) std::memmove(to, from, bytes);
  return cudaSuccess;
}

// One address space (unified addressing): every kind is the same copy; a kind CUDA does not know
// is refused as CUDA refuses it.
cudaError_t memcpy_async(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection);
  if (bytes > 0)
    if (const cudaError_t s = resolve(stream).push([=] { std::memmove(to, from, bytes); }); s)
      return fail(s);
  return sticky_error();
}

cudaError_t memset_sync(void* to, int value, size_t bytes) {
  const cudaError_t status = device_synchronize();
  if (status != cudaSuccess) return status;
  if (bytes > 0) std::memset(to, value, bytes);
  return cudaSuccess;
}

cudaError_t memset_async(void* to, int value, size_t bytes, cudaStream_t stream) {
  if (to == nullptr && bytes > 0) return fail(cudaErrorInvalidValue);
  if (bytes > 0)
    if (const cudaError_t s = resolve(stream).push([=] { std::memset(to, value, bytes); }); s)
      return fail(s);
  return sticky_error();
}

cudaError_t get_device_count(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t set_device(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t get_device(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

// CUEMU_SMS (default 132, an H100's): the multiprocessors every default grid is sized by.
cudaError_t device_attribute(int* value, cudaDeviceAttr attribute, int device) {
  if (value == nullptr || device != 0) return fail(cudaErrorInvalidValue);
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = env_int("CUEMU_SMS", 132);
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t device_properties(cudaDeviceProp* properties, int device) {
  if (properties == nullptr || device != 0) return fail(cudaErrorInvalidValue);
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof(properties->name), "cuemu (CUDA emulator)");
  properties->multiProcessorCount = env_int("CUEMU_SMS", 132);
  properties->maxThreadsPerBlock = 1024;
  properties->sharedMemPerBlock = 48 * 1024;
  properties->major = 9;
  return cudaSuccess;
}

cudaError_t device_synchronize() {
  if (const cudaError_t refused = unsafe_call_in_capture(); refused != cudaSuccess) return refused;
  drain_all_streams();
  return sticky_error();
}

cudaError_t stream_create(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  *stream = new CUstream_st;
  std::lock_guard lock(state().mutex);
  state().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t stream_destroy(cudaStream_t stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard lock(state().mutex);
    if (state().streams.erase(stream) == 0) return fail(cudaErrorInvalidResourceHandle);
  }
  stream->drain();  // CUDA lets queued work finish; so does this
  detach_from_capture(*stream);
  delete stream;
  return cudaSuccess;
}

cudaError_t stream_synchronize(cudaStream_t stream) {
  if (const cudaError_t refused = refuse_if_capturing(resolve(stream)); refused != cudaSuccess)
    return refused;
  resolve(stream).drain();
  return sticky_error();
}

cudaError_t stream_query(cudaStream_t stream) {
  if (const cudaError_t refused = refuse_if_capturing(resolve(stream)); refused != cudaSuccess)
    return refused;
  if (sticky_error() != cudaSuccess) return sticky_error();
  return resolve(stream).idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t occupancy(int* blocks, int threads, size_t shared_bytes) {
  if (blocks == nullptr || threads <= 0 || threads > 1024 || shared_bytes > 48 * 1024)
    return fail(cudaErrorInvalidValue);
  *blocks = 2048 / threads > 0 ? std::min(2048 / threads, 32) : 1;  // 2048 threads per SM
  return cudaSuccess;
}

}  // namespace rt
}  // namespace cuemu
