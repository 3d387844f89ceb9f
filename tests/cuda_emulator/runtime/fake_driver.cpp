// The CUDA runtime's driver-facing half as the emulator fakes it (cuda_runtime_api.h's
// cuemu::drv), for gpu_side/cuda's host code (CudaDevice, the kernel table, CUDA IPC):
//   events       a (stream progress, sequence) pair: reached once the stream completed that
//                many items; cudaStreamWaitEvent queues a wait for it on the other stream;
//   capture      while a stream captures, what is queued on it is recorded (fake_stream.hpp);
//                an event recorded there is a point of the capture, and a stream waiting for
//                it joins; cudaStreamEndCapture checks every joined stream was waited for and
//                yields a graph; a launch queues the recorded work, in order, on its stream;
//                capture modes and the "potentially unsafe" calls follow CUDA's rules;
//   memory       cudaMallocAsync allocates at once (inside a capture too: the graph keeps the
//                address, as CUDA's does), cudaFreeAsync frees in stream order; pointer
//                attributes come from the allocation table and the host-mapped ranges;
//   IPC          the 64-byte handle carries the allocation's address and this process's id;
//   the rest     one device at PCI bus id 0000:00:00.0, so no peer; no driver entry point.
// Errors that CUDA does not make sticky are not: each sets the thread's last error only.
#include "runtime/fake_stream.hpp"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

struct CUevent_st {
  // Under cuemu::capture_mutex(). Recorded outside a capture: the stream's progress and the
  // count it must reach. Inside one: the capture, the stream, its tail and what it was ordered
  // after then (what a stream waiting for this point is ordered after).
  std::shared_ptr<cuemu::Progress> progress;
  uint64_t sequence = 0;
  std::shared_ptr<cuemu::Capture> capture;
  CUstream_st* stream = nullptr;
  uint64_t tail = 0;
  std::map<CUstream_st*, uint64_t> ordered_after;
};

struct CUgraph_st {
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
  std::vector<void*> owned;  // allocated and freed inside the capture: freed with the graph
};

struct CUgraphExec_st {
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
};

namespace cuemu {

namespace {

struct Captures {
  std::vector<std::shared_ptr<Capture>> active;
  unsigned long long last_id = 0;
};
Captures& captures() {                // under capture_mutex()
  static Captures* c = new Captures;  // outlives the streams' workers at teardown
  return *c;
}

// cudaThreadExchangeStreamCaptureMode's per-thread mode; CUDA's default is global.
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

// Locked.
void invalidate(Capture& capture, cudaError_t why) {
  if (capture.invalid == cudaSuccess) capture.invalid = why;
}

// `into` ordered after everything `from` is too (per stream, the later point). Locked.
void order_after(std::map<CUstream_st*, uint64_t>& into,
                 const std::map<CUstream_st*, uint64_t>& from) {
  for (const auto& [stream, tail] : from)
    into[stream] = std::max(into[stream], tail);
}

// The handle's layout (fake, in the 64 bytes CUDA's has): magic, pid, address, bytes.
constexpr uint64_t kIpcMagic = 0x4350494d45554355ull;  // "UCUEMIPC"
struct IpcHandle {
  uint64_t magic, pid, address, bytes;
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));

struct IpcOpens {
  std::mutex mutex;
  std::map<void*, int> count;  // opened handles per address, until cudaIpcCloseMemHandle
};
IpcOpens& ipc_opens() {
  static IpcOpens* o = new IpcOpens;
  return *o;
}

constexpr const char* kBusId = "0000:00:00.0";

}  // namespace

std::mutex& capture_mutex() {
  static std::mutex* m = new std::mutex;  // used by stream workers until the process ends
  return *m;
}

// CUDA's rule: a thread in relaxed mode may make any call; otherwise a capture it began (not
// relaxed) forbids the call, and so does a global-mode capture of any thread when this thread's
// mode is global too. The call fails and the capture is invalidated, as CUDA does.
cudaError_t unsafe_call_in_capture() {
  if (t_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  bool refused = false;
  {
    std::lock_guard lock(capture_mutex());
    for (const auto& capture : captures().active) {
      if (capture->mode == cudaStreamCaptureModeRelaxed) continue;
      if (capture->thread == std::this_thread::get_id() ||
          (capture->mode == cudaStreamCaptureModeGlobal && t_mode == cudaStreamCaptureModeGlobal)) {
        invalidate(*capture, cudaErrorStreamCaptureUnsupported);
        refused = true;
      }
    }
  }
  return refused ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t refuse_if_capturing(CUstream_st& stream) {
  {
    std::lock_guard lock(capture_mutex());
    if (stream.capture == nullptr) return cudaSuccess;
    invalidate(*stream.capture, cudaErrorStreamCaptureUnsupported);
  }
  return fail(cudaErrorStreamCaptureUnsupported);
}

void detach_from_capture(CUstream_st& stream) {
  std::lock_guard lock(capture_mutex());
  if (stream.capture != nullptr) {
    Capture& capture = *stream.capture;
    invalidate(capture, cudaErrorStreamCaptureInvalidated);
    capture.streams.erase(std::find(capture.streams.begin(), capture.streams.end(), &stream));
    if (capture.origin == &stream) {  // nobody can end it now: it is over
      for (CUstream_st* joined : capture.streams) {
        joined->capture.reset();
        joined->capture_tail = 0;
        joined->ordered_after.clear();
      }
      capture.ended = true;
      auto& active = captures().active;
      active.erase(std::find(active.begin(), active.end(), stream.capture));
    }
    stream.capture.reset();
  }
  for (const auto& capture : captures().active)
    for (CUstream_st* member : capture->streams)
      member->ordered_after.erase(&stream);
}

namespace drv {

cudaError_t event_create(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr ||
      flags > (cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
    return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}

// A wait queued for the event stays valid: it holds the stream's progress, not the event.
cudaError_t event_destroy(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(capture_mutex());
  delete event;
  return cudaSuccess;
}

cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st& s = resolve(stream);
  std::lock_guard lock(capture_mutex());
  if (s.capture != nullptr) {
    if (s.capture->invalid != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
    event->progress.reset();
    event->capture = s.capture;
    event->stream = &s;
    event->tail = s.capture_tail;
    event->ordered_after = s.ordered_after;
    return cudaSuccess;
  }
  event->capture.reset();
  event->ordered_after.clear();
  event->progress = s.progress;
  event->sequence = s.end_sequence();
  return sticky_error();
}

cudaError_t event_query(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Progress> progress;
  uint64_t sequence = 0;
  {
    std::lock_guard lock(capture_mutex());
    // A point of a capture is a graph's node: nothing the host can ask about.
    if (event->capture != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
    progress = event->progress;
    sequence = event->sequence;
  }
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (progress == nullptr) return cudaSuccess;  // never recorded: CUDA says done
  return progress->reached(sequence) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t event_synchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Progress> progress;
  uint64_t sequence = 0;
  {
    std::lock_guard lock(capture_mutex());
    if (event->capture != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
    progress = event->progress;
    sequence = event->sequence;
  }
  if (progress != nullptr) progress->wait_for(sequence);
  return sticky_error();
}

cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  CUstream_st& s = resolve(stream);
  std::shared_ptr<Progress> progress;
  uint64_t sequence = 0;
  {
    std::lock_guard lock(capture_mutex());
    if (event->capture != nullptr) {
      const std::shared_ptr<Capture> capture = event->capture;
      // A point of an ended capture is a node of its graph: this fake orders nothing after it
      // (the stream does not join anything, which CudaDevice reports).
      if (capture->ended) return cudaSuccess;
      if (capture->invalid != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
      if (s.capture != nullptr && s.capture != capture) {
        invalidate(*s.capture, cudaErrorStreamCaptureMerge);
        invalidate(*capture, cudaErrorStreamCaptureMerge);
        return fail(cudaErrorStreamCaptureMerge);
      }
      if (s.capture == nullptr) {  // the stream joins the capture (a fork)
        s.capture = capture;
        s.capture_tail = 0;
        s.ordered_after.clear();
        capture->streams.push_back(&s);
      }
      order_after(s.ordered_after, event->ordered_after);
      s.ordered_after[event->stream] = std::max(s.ordered_after[event->stream], event->tail);
      return cudaSuccess;
    }
    if (s.capture != nullptr) {
      // Work outside the capture: CUDA refuses the dependency and invalidates the capture.
      invalidate(*s.capture, cudaErrorStreamCaptureIsolation);
      return fail(cudaErrorStreamCaptureIsolation);
    }
    progress = event->progress;
    sequence = event->sequence;
  }
  if (progress == nullptr || progress == s.progress) return sticky_error();  // nothing to wait for
  if (const cudaError_t queued = s.push([progress, sequence] { progress->wait_for(sequence); });
      queued != cudaSuccess)
    return fail(queued);
  return sticky_error();
}

cudaError_t malloc_async(void** pointer, size_t bytes, cudaStream_t stream) {
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  CUstream_st& s = resolve(stream);
  std::lock_guard lock(capture_mutex());
  if (s.capture != nullptr && s.capture->invalid != cudaSuccess)
    return fail(cudaErrorStreamCaptureInvalidated);
  if (const cudaError_t status = allocate_device(pointer, bytes, true); status != cudaSuccess)
    return status;
  if (s.capture != nullptr) s.capture->allocations.push_back(*pointer);
  return cudaSuccess;
}

cudaError_t free_async(void* pointer, cudaStream_t stream) {
  if (pointer == nullptr) return cudaSuccess;
  DeviceAllocation allocation;
  if (!find_device_allocation(pointer, &allocation) || allocation.base != pointer)
    return fail(cudaErrorInvalidValue);
  CUstream_st& s = resolve(stream);
  {
    std::lock_guard lock(capture_mutex());
    if (s.capture != nullptr) {
      // A free node: CUDA takes it for memory the graph allocated, and refuses any other.
      Capture& capture = *s.capture;
      if (capture.invalid != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
      const auto it = std::find(capture.allocations.begin(), capture.allocations.end(), pointer);
      if (it == capture.allocations.end()) {
        invalidate(capture, cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
      }
      capture.freed.push_back(pointer);
      return cudaSuccess;
    }
  }
  if (const cudaError_t queued = s.push([pointer] { (void)release_device(pointer); });
      queued != cudaSuccess)
    return fail(queued);
  return sticky_error();
}

cudaError_t pointer_attributes(cudaPointerAttributes* attributes, const void* pointer) {
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  attributes->type = cudaMemoryTypeUnregistered;
  DeviceAllocation allocation;
  if (pointer != nullptr && find_device_allocation(pointer, &allocation)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(pointer);
  } else if (pointer != nullptr && is_host_mapped(pointer)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = const_cast<void*>(pointer);  // one address space
    attributes->hostPointer = const_cast<void*>(pointer);
  }
  return cudaSuccess;
}

cudaError_t ipc_get_handle(cudaIpcMemHandle_t* handle, void* pointer) {
  DeviceAllocation allocation;
  // CUDA exports cudaMalloc's allocations by their base; pool memory needs a pool export.
  if (handle == nullptr || !find_device_allocation(pointer, &allocation) ||
      allocation.base != pointer || allocation.pooled)
    return fail(cudaErrorInvalidValue);
  const IpcHandle h{kIpcMagic, static_cast<uint64_t>(::getpid()),
                    reinterpret_cast<uint64_t>(pointer), allocation.bytes};
  *handle = cudaIpcMemHandle_t{};
  std::memcpy(handle->reserved, &h, sizeof h);
  return cudaSuccess;
}

// The emulated device's memory is this process's heap, so only this process's handles name
// anything; unlike CUDA, the process that made a handle may open it (the one address space).
cudaError_t ipc_open_handle(void** pointer, cudaIpcMemHandle_t handle, unsigned int flags) {
  if (pointer == nullptr || flags > cudaIpcMemLazyEnablePeerAccess)
    return fail(cudaErrorInvalidValue);
  IpcHandle h{};
  std::memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != kIpcMagic || h.pid != static_cast<uint64_t>(::getpid()))
    return fail(cudaErrorInvalidValue);
  void* address = reinterpret_cast<void*>(h.address);
  DeviceAllocation allocation;
  if (!find_device_allocation(address, &allocation) || allocation.base != address)
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(ipc_opens().mutex);
  ++ipc_opens().count[address];
  *pointer = address;
  return cudaSuccess;
}

cudaError_t ipc_close_handle(void* pointer) {
  std::lock_guard lock(ipc_opens().mutex);
  const auto it = ipc_opens().count.find(pointer);
  if (it == ipc_opens().count.end()) return fail(cudaErrorInvalidValue);
  if (--it->second == 0) ipc_opens().count.erase(it);
  return cudaSuccess;
}

cudaError_t pci_bus_id(char* bus_id, int length, int device) {
  if (bus_id == nullptr || length <= 0) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::snprintf(bus_id, static_cast<size_t>(length), "%s", kBusId);
  return cudaSuccess;
}

// CUDA takes "[domain]:[bus]:[device].[function]" with the domain optional, in either case.
cudaError_t device_by_pci_bus_id(int* device, const char* bus_id) {
  if (device == nullptr || bus_id == nullptr) return fail(cudaErrorInvalidValue);
  if (::strcasecmp(bus_id, kBusId) != 0 && ::strcasecmp(bus_id, kBusId + 5) != 0)
    return fail(cudaErrorInvalidDevice);
  *device = 0;
  return cudaSuccess;
}

// One device: no peer to reach (CUDA answers 0 for a device and itself).
cudaError_t can_access_peer(int* can, int device, int peer) {
  if (can == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0 || peer != 0) return fail(cudaErrorInvalidDevice);
  *can = 0;
  return cudaSuccess;
}

cudaError_t enable_peer_access(int, unsigned int flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);
  return fail(cudaErrorInvalidDevice);  // the only device is the current one
}

cudaError_t disable_peer_access(int) {
  return fail(cudaErrorInvalidDevice);
}

// No driver behind the fake: every symbol is missing, as on a driver too old for it.
cudaError_t driver_entry_point(const char* symbol, void** function, unsigned int,
                               unsigned long long, cudaDriverEntryPointQueryResult* result) {
  if (symbol == nullptr || function == nullptr) return fail(cudaErrorInvalidValue);
  *function = nullptr;
  if (result != nullptr) *result = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal ||
      *mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  std::swap(*mode, t_mode);
  return cudaSuccess;
}

cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  if (stream == nullptr) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream
  std::lock_guard lock(capture_mutex());
  if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
  auto capture = std::make_shared<Capture>();
  capture->id = ++captures().last_id;
  capture->origin = stream;
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->streams.push_back(stream);
  stream->capture = capture;
  stream->capture_tail = 0;
  stream->ordered_after.clear();
  captures().active.push_back(std::move(capture));
  return cudaSuccess;
}

cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  CUstream_st& s = resolve(stream);
  std::lock_guard lock(capture_mutex());
  const std::shared_ptr<Capture> capture = s.capture;
  if (capture == nullptr) return fail(cudaErrorIllegalState);
  if (capture->origin != &s) {
    invalidate(*capture, cudaErrorStreamCaptureUnmatched);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (capture->mode != cudaStreamCaptureModeRelaxed &&
      capture->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  // Every stream that joined must be joined back: its last node ordered before the end.
  cudaError_t status =
      capture->invalid != cudaSuccess ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
  for (CUstream_st* joined : capture->streams) {
    if (status != cudaSuccess || joined == &s) continue;
    const auto it = s.ordered_after.find(joined);
    if (joined->capture_tail > (it != s.ordered_after.end() ? it->second : 0))
      status = cudaErrorStreamCaptureUnjoined;
  }
  for (CUstream_st* joined : capture->streams) {
    joined->capture.reset();
    joined->capture_tail = 0;
    joined->ordered_after.clear();
  }
  capture->ended = true;
  auto& active = captures().active;
  active.erase(std::find(active.begin(), active.end(), capture));
  if (status != cudaSuccess) return fail(status);
  auto made = new CUgraph_st;
  made->nodes =
      std::make_shared<const std::vector<std::function<void()>>>(std::move(capture->nodes));
  made->owned = std::move(capture->freed);
  *graph = made;
  return cudaSuccess;
}

cudaError_t capture_info(cudaStream_t stream, cudaStreamCaptureStatus* status,
                         unsigned long long* id) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  CUstream_st& s = resolve(stream);
  std::lock_guard lock(capture_mutex());
  if (s.capture == nullptr) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = s.capture->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                              : cudaStreamCaptureStatusActive;
  if (id != nullptr) *id = s.capture->id;
  return cudaSuccess;
}

cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

// The recorded work as one item of the stream: in order, after what the stream ran before.
cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t queued = resolve(stream).push([nodes = exec->nodes] {
        for (const auto& node : *nodes)
          node();
      });
      queued != cudaSuccess)
    return fail(queued);
  return sticky_error();
}

// Memory the graph freed inside the capture is its own: freed once no launch can still use it.
cudaError_t graph_destroy(cudaGraph_t graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  if (!graph->owned.empty()) drain_all_streams();
  for (void* owned : graph->owned)
    (void)release_device(owned);
  delete graph;
  return cudaSuccess;
}

cudaError_t graph_exec_destroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}

}  // namespace drv
}  // namespace cuemu
