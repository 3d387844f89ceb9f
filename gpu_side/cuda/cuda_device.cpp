// The CUDA DeviceRuntime (cuda_device.hpp).
#include "gpu_side/cuda/cuda_device.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu_side/cuda/cuda_ipc.hpp"
#include "gpu_side/cuda/cuda_kernels.hpp"
#include "gpu_side/cuda/current_device.hpp"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ring_push.hpp"
#include "gpu_side/cuda/stream_signal.hpp"
#include "gpu_side/device/capture_state.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::cuda {

namespace {

constexpr const char* kPhase = "cuda device";

// A cudaEvent_t (timing off: the cheapest kind) and the device it was recorded on.
class CudaEvent final : public device::DeviceEvent {
 public:
  explicit CudaEvent(int ordinal) : ordinal_(ordinal) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), kPhase,
               "cudaEventCreateWithFlags");
  }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  int ordinal() const { return ordinal_; }
  bool captured() const override { return capture_id_ != 0; }
  // The capture (cudaStreamGetCaptureInfo's id) the event was recorded in; 0: none.
  unsigned long long capture_id() const { return capture_id_; }
  void set_capture_id(unsigned long long id) { capture_id_ = id; }

 private:
  cudaEvent_t event_ = nullptr;
  int ordinal_;
  unsigned long long capture_id_ = 0;
};

// The capture `stream` is part of (begun on it, or joined), 0 for none; a stream that cannot be
// asked (the legacy stream while another captures globally) counts as none.
unsigned long long capture_id_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &id) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; leave nothing for the next check to find
    return 0;
  }
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

// A captured graph and its executable (instantiated once, launched as often as wanted), and
// the check of the capturing stream's failed waits: its wait_value kernels record their
// timeouts in that stream's fault word, wherever the graph is launched. Holding the check
// keeps that stream's state (the fault word the kernels write) alive while the graph lives.
class CudaGraph final : public device::DeviceGraph {
 public:
  using WaitCheck = std::function<void(std::string_view phase)>;
  CudaGraph(int ordinal, cudaGraph_t graph, WaitCheck origin_waits)
      : ordinal_(ordinal), graph_(graph), origin_waits_(std::move(origin_waits)) {}
  ~CudaGraph() override {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Graph-owned allocations freed at each launch: a captured cudaMallocAsync without its free
  // would otherwise forbid the next launch.
  void instantiate(const char* phase) {
    check_cuda(cudaGraphInstantiate(&exec_, graph_, cudaGraphInstantiateFlagAutoFreeOnLaunch),
               phase, "cudaGraphInstantiate");
  }
  cudaGraphExec_t exec() const { return exec_; }
  int ordinal() const { return ordinal_; }
  // Throws proxyep::Error(phase) once a wait of the capturing stream failed.
  void require_no_failed_wait(std::string_view phase) const { origin_waits_(phase); }

 private:
  int ordinal_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_ = nullptr;
  WaitCheck origin_waits_;
};

}  // namespace

struct CudaDevice::State {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  // The stream's first failed wait_value (stream_signal.hpp), mapped pinned host memory: the
  // host's view and the kernels'.
  WaitFault* fault = nullptr;
  WaitFault* fault_on_device = nullptr;
  // What each wait number stands for: the wait_value calls' phases and timeouts (one entry per
  // distinct pair, so a graph replaying a wait still names it).
  struct Wait {
    std::string phase;
    int64_t timeout_ms;
  };
  std::mutex waits_mutex;
  std::vector<Wait> waits;
  // A capture in progress (begin_capture .. end_capture): its phase, and the first call a graph
  // cannot hold, which end_capture reports.
  // A stream that joined another's capture (wait_event for a point inside it) holds one too,
  // marked joined: it leaves when CUDA says the stream captures no more (the origin ended it).
  mutable std::mutex capture_mutex;
  mutable std::optional<device::CaptureState> capture;
  mutable bool joined = false;
  // Memory of this stream dropped while the stream was captured (its own capture or one it
  // joined): cudaFreeAsync there would be a free node of the graph, which CUDA refuses for
  // memory the graph did not allocate, and the graph may still use it at every launch. Kept
  // until the stream goes (a graph launched after its Buffer is gone is the caller's error, as
  // with DeepEP). Under capture_mutex.
  std::vector<void*> kept_for_graphs;

  ~State() {
    if (stream == nullptr) return;
    const auto current = CurrentDevice::quietly(ordinal);
    for (void* kept : kept_for_graphs)
      (void)cudaFreeAsync(kept, stream);
    (void)cudaGetLastError();
    const cudaError_t status = cudaStreamSynchronize(stream);
    if (status != cudaSuccess)
      log::warn("cuda device {}: stream failed at teardown: {}", ordinal,
                cudaGetErrorString(status));
    (void)cudaStreamDestroy(stream);
    if (fault != nullptr) (void)cudaFreeHost(fault);
  }
  uint64_t wait_number(std::string_view phase, std::chrono::milliseconds timeout) {
    std::lock_guard lock(waits_mutex);
    for (size_t i = 0; i < waits.size(); ++i)
      if (waits[i].phase == phase && waits[i].timeout_ms == timeout.count()) return i + 1;
    waits.push_back({std::string(phase), timeout.count()});
    return waits.size();
  }
  // Throws proxyep::Error(phase) once a wait of the stream failed (sticky: the fault stays).
  // Read after the stream passed the failed wait (its fields are written by then).
  void require_no_failed_wait(std::string_view phase) {
    const uint64_t number = std::atomic_ref<uint64_t>(fault->wait).load(std::memory_order_acquire);
    if (number == 0) return;
    Wait wait{"?", 0};
    {
      std::lock_guard lock(waits_mutex);
      if (number <= waits.size()) wait = waits[number - 1];
    }
    fail(std::string(phase),
         "cuda device {}: wait_value ({}): the signal word at {:#x} holds {}, not {}, after {} ms",
         ordinal, wait.phase, fault->word, fault->seen, fault->expected, wait.timeout_ms);
  }
  // Inside a capture, a call a graph cannot hold (`what`): invalidates the capture and throws
  // proxyep::Error(phase), before CUDA is asked. Nothing outside one. A stream that joined
  // another's capture invalidates CUDA's capture too (a cudaStreamQuery on a capturing stream
  // does): the stream that began it, maybe not this runtime's (torch's), must fail its
  // cudaStreamEndCapture instead of returning a graph without the refused call.
  void refuse_in_capture(std::string_view what, std::string_view phase) {
    std::lock_guard lock(capture_mutex);
    forget_ended_join();
    if (!capture) return;
    if (joined) {
      const auto current = CurrentDevice::quietly(ordinal);
      (void)cudaStreamQuery(stream);
      (void)cudaGetLastError();
    }
    capture->refuse(what, phase, fmt::format("cuda device {}: ", ordinal));
  }
  // The deleter of this stream's memory: queued for freeing in stream order, or kept while the
  // stream is captured (kept_for_graphs).
  void release(void* memory) {
    const auto current = CurrentDevice::quietly(ordinal);
    {
      std::lock_guard lock(capture_mutex);
      forget_ended_join();
      if (capture || capture_id_of(stream) != 0) {
        kept_for_graphs.push_back(memory);
        return;
      }
    }
    (void)cudaFreeAsync(memory, stream);
    (void)cudaGetLastError();  // a failure is a leak, not the next launch's error
  }
  bool capturing() const {
    std::lock_guard lock(capture_mutex);
    forget_ended_join();
    return capture.has_value();
  }
  // A joined capture the origin ended (or CUDA invalidated) is over for this stream too.
  // Locked.
  void forget_ended_join() const {
    if (!capture || !joined || capture_id_of(stream) != 0) return;
    capture.reset();
    joined = false;
  }
  // Every call of the runtime API acts on the calling thread's current device: this one for the
  // scope of the returned guard, the caller's again after it.
  [[nodiscard]] CurrentDevice select() const { return {ordinal, kPhase}; }
};

CudaDevice::CudaDevice(int ordinal) : state_(std::make_shared<State>()) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  require(status == cudaSuccess && count > 0, kPhase, "no usable CUDA device: {}",
          status == cudaSuccess ? "cudaGetDeviceCount found 0" : cudaGetErrorString(status));
  if (ordinal < 0) check_cuda(cudaGetDevice(&ordinal), kPhase, "cudaGetDevice");
  require(ordinal < count, kPhase, "device {} does not exist ({} found)", ordinal, count);
  state_->ordinal = ordinal;
  const CurrentDevice current = state_->select();
  check_cuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), kPhase,
             "cudaStreamCreateWithFlags");
  void* fault = nullptr;
  check_cuda(cudaHostAlloc(&fault, sizeof(WaitFault), cudaHostAllocMapped | cudaHostAllocPortable),
             kPhase, "cudaHostAlloc (wait fault)");
  state_->fault = static_cast<WaitFault*>(fault);
  *state_->fault = WaitFault{};
  void* on_device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&on_device, fault, 0), kPhase,
             "cudaHostGetDevicePointer (wait fault)");
  state_->fault_on_device = static_cast<WaitFault*>(on_device);
}

CudaDevice::~CudaDevice() = default;

std::shared_ptr<device::DeviceRuntime> CudaDevice::open_stream() const {
  return std::make_shared<CudaDevice>(state_->ordinal);
}

int CudaDevice::ordinal() const {
  return state_->ordinal;
}

void* CudaDevice::stream() const {
  return state_->stream;
}

std::shared_ptr<std::byte[]> CudaDevice::allocate(uint64_t bytes) {
  const CurrentDevice current = state_->select();
  void* memory = nullptr;
  check_cuda(cudaMallocAsync(&memory, std::max<uint64_t>(bytes, 1), state_->stream), kPhase,
             "cudaMallocAsync");
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(memory),
                                      [state = state_](std::byte* p) { state->release(p); });
}

device::NicMemory CudaDevice::allocate_for_nic(uint64_t bytes) {
  const CurrentDevice current = state_->select();
  void* memory = nullptr;
  check_cuda(cudaMalloc(&memory, std::max<uint64_t>(bytes, 1)), kPhase, "cudaMalloc");
  device::NicMemory nic;
  nic.memory =
      std::shared_ptr<std::byte[]>(static_cast<std::byte*>(memory), [state = state_](std::byte* p) {
        const auto current = CurrentDevice::quietly(state->ordinal);
        (void)cudaFree(p);  // waits for the device
        (void)cudaGetLastError();
      });
  nic.bytes = bytes;
  return nic;
}

device::SharedMemory CudaDevice::allocate_shared(uint64_t bytes) {
  return allocate_shared_memory(state_->ordinal, bytes);
}

std::shared_ptr<std::byte[]> CudaDevice::open_shared(std::span<const uint8_t> handle,
                                                     uint64_t bytes, std::string_view phase) {
  return open_shared_memory(state_->ordinal, handle, bytes, phase);
}

void* CudaDevice::register_host(void* host, uint64_t bytes) {
  const CurrentDevice current = state_->select();
  check_cuda(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
             kPhase, "cudaHostRegister");
  void* device = nullptr;
  const cudaError_t status = cudaHostGetDevicePointer(&device, host, 0);
  if (status != cudaSuccess) {
    (void)cudaHostUnregister(host);
    check_cuda(status, kPhase, "cudaHostGetDevicePointer");
  }
  return device;
}

void CudaDevice::unregister_host(void* host) {
  const CurrentDevice current = state_->select();
  check_cuda(cudaHostUnregister(host), kPhase, "cudaHostUnregister");
}

namespace {

// Host memory CUDA has not registered (pageable): what a captured copy may not touch.
bool plain_host_memory(const void* p) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  (void)cudaGetLastError();  // not sticky; leave nothing for the next check to find
  return status != cudaSuccess || attributes.type == cudaMemoryTypeUnregistered;
}

}  // namespace

void CudaDevice::copy(void* to, const void* from, uint64_t bytes) {
  if (bytes == 0) return;
  const CurrentDevice current = state_->select();
  if (state_->capturing() && (plain_host_memory(to) || plain_host_memory(from)))
    state_->refuse_in_capture(fmt::format("copy: {} bytes {} plain host memory", bytes,
                                          plain_host_memory(to) ? "into" : "from"),
                              kPhase);
  check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, state_->stream), kPhase,
             "cudaMemcpyAsync");
}

void CudaDevice::fill(void* to, uint8_t value, uint64_t bytes) {
  if (bytes == 0) return;
  const CurrentDevice current = state_->select();
  check_cuda(cudaMemsetAsync(to, value, bytes, state_->stream), kPhase, "cudaMemsetAsync");
}

device::BoundKernels CudaDevice::kernels() {
  return {cuda_kernels(), *this};
}

namespace {

// The stream's producer state of one ring (ring_push.hpp), in device memory.
class CudaRingProducer final : public device::DeviceRingProducer {
 public:
  CudaRingProducer(const void* stream, RingHeader* header, uint64_t capacity,
                   std::shared_ptr<std::byte[]> counters)
      : stream_(stream), header_(header), capacity_(capacity), counters_(std::move(counters)) {}
  const void* stream() const { return stream_; }
  RingHeader* header() const { return header_; }
  uint64_t capacity() const { return capacity_; }
  RingPushCounters* counters() const {
    return reinterpret_cast<RingPushCounters*>(counters_.get());
  }

 private:
  const void* stream_;  // the State it was attached on
  RingHeader* header_;  // as the device addresses it
  uint64_t capacity_;
  std::shared_ptr<std::byte[]> counters_;
};

}  // namespace

std::unique_ptr<device::DeviceRingProducer> CudaDevice::attach_ring(const Ring& ring) {
  require(ring.producer_mode() == ProducerMode::multi, kPhase,
          "attach_ring: a device pushes into multi-producer rings only (ring_producer.cuh)");
  const CurrentDevice current = state_->select();
  void* header = nullptr;
  check_cuda(cudaHostGetDevicePointer(&header, &ring.header(), 0), kPhase,
             "attach_ring: cudaHostGetDevicePointer (register the ring's memory first)");
  // Off the stream, synchronously: a ring may be attached while the stream is captured (the
  // first captured call between nodes opens the step transport, its setup with the thread's
  // capture relaxed), and the graph must hold neither the counters' allocation (it would own
  // and free it) nor a copy from host memory. Positions continue where the ring stands (nobody
  // else produces into it).
  void* counters = nullptr;
  check_cuda(cudaMalloc(&counters, sizeof(RingPushCounters)), kPhase,
             "attach_ring: cudaMalloc (ring counters)");
  std::shared_ptr<std::byte[]> owned(static_cast<std::byte*>(counters),
                                     [ordinal = state_->ordinal](std::byte* p) {
                                       const auto current = CurrentDevice::quietly(ordinal);
                                       (void)cudaFree(p);  // after the stream's pushes
                                       (void)cudaGetLastError();
                                     });
  const RingPushCounters initial{
      .head = atomic(ring.header().producer.head).load(std::memory_order_acquire),
      .cached_tail = atomic(ring.header().consumer.tail).load(std::memory_order_acquire)};
  check_cuda(cudaMemcpy(counters, &initial, sizeof(initial), cudaMemcpyHostToDevice), kPhase,
             "attach_ring: cudaMemcpy (ring counters)");
  return std::make_unique<CudaRingProducer>(state_.get(), static_cast<RingHeader*>(header),
                                            ring.capacity(), std::move(owned));
}

void CudaDevice::ring_push(device::DeviceRingProducer& producer, const Descriptor* descriptors,
                           int64_t count, std::chrono::milliseconds timeout) {
  auto* ring = dynamic_cast<CudaRingProducer*>(&producer);
  require(ring != nullptr && ring->stream() == state_.get(), kPhase,
          "ring_push: the ring was not attached to this device's stream");
  require(count >= 0, kPhase, "ring_push: {} descriptors", count);
  if (count == 0) return;
  const CurrentDevice current = state_->select();
  check_cuda(
      launch_ring_push(ring->header(), ring->capacity(), ring->counters(), descriptors, count,
                       static_cast<uint64_t>(timeout.count()) * 1000000, state_->stream),
      kPhase, "ring_push launch");
}

namespace {

// A signal word the stream may use: aligned, and memory the GPU reaches (device memory or
// registered host memory).
void require_signal_word(const void* word, std::string_view op, std::string_view phase) {
  require(reinterpret_cast<uintptr_t>(word) % alignof(uint64_t) == 0, phase,
          "{}: the signal word at {} is not 8-byte aligned", op, word);
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, word);
  (void)cudaGetLastError();  // not sticky; an unregistered pointer is an answer, not a failure
  require(status == cudaSuccess && attributes.type != cudaMemoryTypeUnregistered, phase,
          "{}: the signal word at {} is neither device memory nor registered host memory", op,
          word);
}

}  // namespace

void CudaDevice::wait_value(const uint64_t* word, device::SignalValue value,
                            std::chrono::milliseconds timeout, std::string_view phase,
                            int64_t* waited_ns) {
  // First: the pointer queries below act on the current device too.
  const CurrentDevice current = state_->select();
  require_signal_word(word, "wait_value", phase);
  if (value.epoch != nullptr)
    require_signal_word(value.epoch, "wait_value (its epoch word)", phase);
  if (waited_ns != nullptr)
    require_signal_word(reinterpret_cast<const uint64_t*>(waited_ns), "wait_value (its waited_ns)",
                        phase);
  check_cuda(launch_wait_value(word, value, static_cast<uint64_t>(timeout.count()) * 1000000,
                               state_->fault_on_device, state_->wait_number(phase, timeout),
                               waited_ns, state_->stream),
             kPhase, "wait_value launch");
}

void CudaDevice::write_value(uint64_t* word, device::SignalValue value, std::string_view phase) {
  const CurrentDevice current = state_->select();
  require_signal_word(word, "write_value", phase);
  if (value.epoch != nullptr)
    require_signal_word(value.epoch, "write_value (its epoch word)", phase);
  check_cuda(launch_write_value(word, value, state_->fault_on_device, state_->stream), kPhase,
             "write_value launch");
}

void CudaDevice::add_value(uint64_t* word, uint64_t delta, std::string_view phase) {
  const CurrentDevice current = state_->select();
  require_signal_word(word, "add_value", phase);
  check_cuda(launch_add_value(word, delta, state_->fault_on_device, state_->stream), kPhase,
             "add_value launch");
}

std::shared_ptr<device::DeviceEvent> CudaDevice::record() {
  return record_on(state_->stream);
}

std::shared_ptr<device::DeviceEvent> CudaDevice::record_on(void* caller_stream) {
  const CurrentDevice current = state_->select();
  auto event = std::make_shared<CudaEvent>(state_->ordinal);
  check_cuda(cudaEventRecord(event->get(), static_cast<cudaStream_t>(caller_stream)), kPhase,
             "cudaEventRecord");
  event->set_capture_id(capture_id_of(static_cast<cudaStream_t>(caller_stream)));
  return event;
}

void CudaDevice::wait_event(const std::shared_ptr<device::DeviceEvent>& event,
                            std::chrono::milliseconds) {
  auto cuda = std::dynamic_pointer_cast<CudaEvent>(event);
  if (cuda == nullptr || !cuda->captured()) {
    state_->refuse_in_capture("wait_event: an event recorded outside the capture joins the stream",
                              kPhase);
    return wait_on(state_->stream, event, kPhase);
  }
  // A point inside a capture: the stream joins it (cudaStreamWaitEvent forks the capture into
  // this stream), or, in it already, is ordered after that point.
  const CurrentDevice current = state_->select();
  const unsigned long long own = capture_id_of(state_->stream);
  require(own == 0 || own == cuda->capture_id(), kPhase,
          "wait_event: the event was recorded inside another capture than the one this stream "
          "is part of");
  if (own != 0) return wait_on(state_->stream, event, kPhase);
  require(cuda->ordinal() == state_->ordinal, kPhase,
          "wait_event: the event was not recorded on CUDA device {}", state_->ordinal);
  const cudaError_t status = cudaStreamWaitEvent(state_->stream, cuda->get(), 0);
  (void)cudaGetLastError();  // not sticky; leave nothing for the next check to find
  require(status == cudaSuccess && capture_id_of(state_->stream) == cuda->capture_id(), kPhase,
          "wait_event: the event was recorded inside a capture that has ended ({}): a point in "
          "a graph, which a stream outside it cannot wait for",
          status == cudaSuccess ? "the stream did not join it" : cudaGetErrorString(status));
  std::lock_guard lock(state_->capture_mutex);
  state_->capture.emplace();
  state_->capture->phase = "the capture this stream joined";
  state_->joined = true;
}

void CudaDevice::wait_on(void* caller_stream, const std::shared_ptr<device::DeviceEvent>& event,
                         std::string_view phase) {
  auto cuda = std::dynamic_pointer_cast<CudaEvent>(event);
  require(cuda != nullptr && cuda->ordinal() == state_->ordinal, phase,
          "wait_event: the event was not recorded on CUDA device {}", state_->ordinal);
  const CurrentDevice current = state_->select();
  // The stream holds its own reference to the event's work: destroying the event after this
  // call is allowed (cudaEventDestroy defers until the recorded work completes).
  const std::string where(phase);
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(caller_stream), cuda->get(), 0),
             where.c_str(), "cudaStreamWaitEvent");
}

namespace {

// Polls `query` (cudaStreamQuery, cudaEventQuery) until it stops saying cudaErrorNotReady, for
// at most `timeout`: the blocking calls have no deadline, and a kernel stuck on a dead peer must
// become an error, not a hang.
template <typename Query>
void poll_until_done(Query&& query, int ordinal, std::string_view phase, std::string_view what,
                     std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const cudaError_t status = query();
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady)
      fail(std::string(phase), "cuda device {}: {}", ordinal, cudaGetErrorString(status));
    if (std::chrono::steady_clock::now() >= deadline)
      fail(std::string(phase), "cuda device {}: {} after {} ms", ordinal, what, timeout.count());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

const CudaEvent& recorded_here(const device::DeviceEvent& event, int ordinal,
                               std::string_view phase) {
  const auto* cuda = dynamic_cast<const CudaEvent*>(&event);
  require(cuda != nullptr && cuda->ordinal() == ordinal, phase,
          "the host waits only for an event recorded on CUDA device {}", ordinal);
  require(!cuda->captured(), phase,
          "the event was recorded inside a capture: a point in a graph, which the host cannot "
          "wait for");
  return *cuda;
}

}  // namespace

bool CudaDevice::reached(const device::DeviceEvent& event, std::string_view phase) {
  const CudaEvent& cuda = recorded_here(event, state_->ordinal, phase);
  state_->refuse_in_capture("reached: the host asks whether the stream reached an event", phase);
  const CurrentDevice current = state_->select();
  const cudaError_t status = cudaEventQuery(cuda.get());
  if (status == cudaErrorNotReady) return false;
  if (status != cudaSuccess)
    fail(std::string(phase), "cuda device {}: {}", state_->ordinal, cudaGetErrorString(status));
  state_->require_no_failed_wait(phase);
  return true;
}

void CudaDevice::wait_for(const device::DeviceEvent& event, std::string_view phase,
                          std::chrono::milliseconds timeout) {
  const CudaEvent& cuda = recorded_here(event, state_->ordinal, phase);
  state_->refuse_in_capture("wait_for: the host waits for an event of the stream", phase);
  const CurrentDevice current = state_->select();
  poll_until_done([&] { return cudaEventQuery(cuda.get()); }, state_->ordinal, phase,
                  "the stream has not reached the event", timeout);
  state_->require_no_failed_wait(phase);
}

void CudaDevice::synchronize(std::string_view phase, std::chrono::milliseconds timeout) {
  state_->refuse_in_capture("synchronize: the host waits for the stream", phase);
  const CurrentDevice current = state_->select();
  poll_until_done([&] { return cudaStreamQuery(state_->stream); }, state_->ordinal, phase,
                  "the stream is still busy", timeout);
  state_->require_no_failed_wait(phase);
}

// Thread-local capture mode: an unsafe call (a cudaMalloc, a synchronize) from the capturing
// thread fails the capture, as it would corrupt the graph; the proxies' threads never touch
// this stream.
void CudaDevice::begin_capture(std::string_view phase) {
  const std::string where(phase);
  std::lock_guard lock(state_->capture_mutex);
  state_->forget_ended_join();
  require(!state_->capture, phase, "begin_capture: the stream is already being captured (by {})",
          state_->capture ? state_->capture->phase : "");
  state_->require_no_failed_wait(phase);
  const CurrentDevice current = state_->select();
  check_cuda(cudaStreamBeginCapture(state_->stream, cudaStreamCaptureModeThreadLocal),
             where.c_str(), "cudaStreamBeginCapture");
  state_->capture.emplace();
  state_->capture->phase = where;
}

std::unique_ptr<device::DeviceGraph> CudaDevice::end_capture(std::string_view phase) {
  const std::string where(phase);
  std::optional<device::CaptureState> ended;
  {
    std::lock_guard lock(state_->capture_mutex);
    state_->forget_ended_join();
    require(state_->capture.has_value(), phase, "end_capture: the stream is not being captured");
    require(!state_->joined, phase,
            "end_capture: the stream joined a capture begun on another stream; end it there");
    ended = std::move(state_->capture);
    state_->capture.reset();
  }
  const CurrentDevice current = state_->select();
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(state_->stream, &graph);
  (void)cudaGetLastError();  // capture errors are not sticky
  if (ended->invalid || status != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    fail(where, "cuda device {}: end_capture: the capture is invalid: {}", state_->ordinal,
         ended->invalid ? *ended->invalid : std::string(cudaGetErrorString(status)));
  }
  auto captured = std::make_unique<CudaGraph>(
      state_->ordinal, graph,
      [state = state_](std::string_view p) { state->require_no_failed_wait(p); });
  captured->instantiate(where.c_str());
  return captured;
}

void CudaDevice::launch(const device::DeviceGraph& graph, std::string_view phase) {
  const auto* cuda = dynamic_cast<const CudaGraph*>(&graph);
  require(cuda != nullptr && cuda->ordinal() == state_->ordinal, phase,
          "launch: the graph was not captured on CUDA device {}", state_->ordinal);
  require(!state_->capturing(), phase,
          "launch: the stream is being captured; launch the graph outside the capture");
  state_->require_no_failed_wait(phase);
  cuda->require_no_failed_wait(phase);  // an earlier launch's, wherever it ran
  const std::string where(phase);
  const CurrentDevice current = state_->select();
  check_cuda(cudaGraphLaunch(cuda->exec(), state_->stream), where.c_str(), "cudaGraphLaunch");
}

std::shared_ptr<void> CudaDevice::relax_capture() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), kPhase, "relaxing the capture mode");
  // The deleter runs for the null pointer too: it puts the thread's previous mode back.
  return std::shared_ptr<void>(
      nullptr, [mode](void*) mutable { (void)cudaThreadExchangeStreamCaptureMode(&mode); });
}

bool CudaDevice::capturing() const {
  return state_->capturing();
}

}  // namespace proxyep::gpu_side::cuda
