// DeviceRuntime: what a backend needs from a GPU, and nothing more: device memory, host memory
// made visible to kernels, copies and fills, the EP kernels of both modes, and waits. Every
// operation but synchronize() is queued on the runtime's one stream and runs after the ones
// queued before it, as on a CUDA stream; pointers it is given must stay valid until the next
// synchronize() returns.
//
// Two implementations share every line above this interface:
//   CudaDevice       (gpu_side/cuda/cuda_device.hpp)  the CUDA runtime and the kernels of
//                                                     gpu_side/cuda; built only with nvcc
//   SimulatedDevice  (simulated_device.hpp)           the host standing in for the GPU: separate
//                    allocations no other thread may touch, a worker thread for the stream, the
//                    kernels' CPU twins, and a check of every address an operation is given
// so what can be wrong in the wiring (which memory is passed where, what waits on what) is
// tested on every run, without a GPU.
//
// Errors. An operation with inconsistent parameters or an address the device cannot reach
// throws proxyep::Error(phase) at once, before anything is queued. A failure while the stream
// runs is sticky, as CUDA's are: synchronize() throws it, naming the operation.
#pragma once

#include "common/error.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/device/signal_value.hpp"
#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ring.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::device {

// A point in one stream's work (a cudaEvent_t), from DeviceRuntime::record(). Opaque: only a
// runtime of the same kind and device can wait for it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Recorded while its stream was being captured (begin_capture): a point inside a graph, not in
  // the stream's live work, so neither the host nor a stream outside the capture can wait for it.
  virtual bool captured() const { return false; }
};

// A stream's captured operations (a cudaGraphExec_t), from DeviceRuntime::end_capture(). Opaque:
// only a runtime of the same kind and device launches it.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

// A descriptor ring a runtime's stream produces into, from DeviceRuntime::attach_ring(). Opaque:
// it holds the producer's state (a GPU's reservation counter and cached tail in device memory).
class DeviceRingProducer {
 public:
  virtual ~DeviceRingProducer() = default;
};

// Device memory a NIC may read and write directly (GPUDirect RDMA), for a fabric that registers
// device memory (FI_HMEM): from DeviceRuntime::allocate_for_nic().
struct NicMemory {
  std::shared_ptr<std::byte[]> memory;  // null: this runtime offers none
  uint64_t bytes = 0;
  // How the fabric registers it: as host memory (the simulated device's stand-in, which is host
  // memory the proxy threads may read) or as CUDA memory (FI_HMEM_CUDA).
  bool registers_as_host = false;
};

// Device memory the node's other ranks may open (CUDA IPC), from DeviceRuntime::allocate_shared():
// the memory, and the handle a peer passes to open_shared() to reach it.
struct SharedMemory {
  std::shared_ptr<std::byte[]> memory;  // null: this runtime shares none
  uint64_t bytes = 0;
  std::vector<uint8_t> handle;  // opaque; at most kSharedHandleBytes
  // Whether a NIC may also write and read it once the fabric registered it (GPUDirect RDMA, as
  // NicMemory), and how: as host memory (the simulated device's stand-in) or as CUDA memory.
  bool nic_reads = false;
  bool registers_as_host = false;
  // A file descriptor of the same memory where the device has one (the simulated device's
  // memfd; CUDA: -1, the handle is all there is), owned with `memory` and valid while it lives:
  // a process it is passed to over a Unix socket (the node daemon) maps the pages from it, as
  // the NIC's view (open_for_nic in simulated_device.hpp).
  int fd = -1;
};
inline constexpr uint64_t kSharedHandleBytes = 128;

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  // "cuda" or "simulated": for logs and errors.
  virtual std::string_view kind() const = 0;

  // Another stream of this device, as a second cudaStream_t: the same memory and kernels, its own
  // queue, ordered with this one only through events (record / wait_event). Throws
  // proxyep::Error when the device cannot make one.
  virtual std::shared_ptr<DeviceRuntime> open_stream() const = 0;

  // `bytes` of device memory (at least 256-byte aligned, uninitialised), released when the last
  // owner drops it, after the work queued before that point (stream-ordered, like
  // cudaFreeAsync): a tensor may be dropped while a kernel that uses it is still queued.
  virtual std::shared_ptr<std::byte[]> allocate(uint64_t bytes) = 0;

  // `bytes` of device memory kernels use as they use allocate()'s, which a NIC may also read and
  // write once the fabric registered it (GPUDirect RDMA), released when the last owner drops it
  // (not stream-ordered: only after the work that uses it finished). None (the default) where
  // the runtime cannot offer such memory.
  virtual NicMemory allocate_for_nic(uint64_t bytes) {
    (void)bytes;
    return {};
  }

  // `bytes` of device memory (kernels use it as allocate()'s) that runtimes of the same kind on
  // this node, in this process or another, may open (open_shared) so that their kernels write
  // and read it too: a node peer's arena (cudaMalloc + cudaIpcGetMemHandle). Released when the
  // last owner drops it, not stream-ordered (after the work that uses it finished). None (the
  // default) where the runtime cannot share memory.
  virtual SharedMemory allocate_shared(uint64_t bytes) {
    (void)bytes;
    return {};
  }
  // Opens memory a node peer's runtime shared (its SharedMemory::handle, `bytes` long) and
  // returns the address this runtime's kernels use for it (maybe not the owner's address),
  // reachable until the returned pointer's last owner drops it (then closed, not stream-ordered).
  // Throws proxyep::Error(phase) when the handle is not this kind's or cannot be opened.
  virtual std::shared_ptr<std::byte[]> open_shared(std::span<const uint8_t> handle, uint64_t bytes,
                                                   std::string_view phase) {
    (void)handle, (void)bytes;
    fail(std::string(phase), "a {} device cannot open memory another device shared", kind());
  }

  // Makes `bytes` of host memory at `host` (an arena, a staging area) reachable by the device
  // (cudaHostRegister, mapped) and returns the address kernels use for it. Until unregister_host
  // the host memory must stay mapped. Registering memory twice is an error.
  virtual void* register_host(void* host, uint64_t bytes) = 0;
  virtual void unregister_host(void* host) = 0;

  // Stream-ordered operations. Addresses are device addresses: device memory or registered host
  // memory. copy() also takes plain host memory on either side, which it may read or write at
  // any time until the next synchronize() returns (CUDA may finish sooner; nothing relies on it).
  virtual void copy(void* to, const void* from, uint64_t bytes) = 0;
  virtual void fill(void* to, uint8_t value, uint64_t bytes) = 0;
  virtual void dispatch_layout(const ep::LayoutParams& params) = 0;
  virtual void dispatch_rows(const ep::DispatchParams& params) = 0;
  virtual void dispatch_chunk(const ep::ChunkParams& params) = 0;
  virtual void combine(const ep::CombineParams& params) = 0;
  virtual void add(const ep::AddParams& params) = 0;
  virtual void copy_runs(const ep::CopyRunsParams& params) = 0;
  // The low-latency kernels (ll_kernel_params.hpp).
  virtual void ll_pack(const ep::LlPackParams& params) = 0;
  virtual void ll_combine(const ep::LlCombineParams& params) = 0;
  // The routing of a low-latency dispatch from a device topk_idx (ep/ll_route.hpp): throws
  // proxyep::Error at once for sizes ll_route_error refuses.
  virtual void ll_route(const ep::LlRouteParams& params) = 0;
  // The pack placed by ll_route's output (LlPackRoutedParams), with no host-made item list.
  virtual void ll_pack_routed(const ep::LlPackRoutedParams& params) = 0;
  // The combine whose rows are found by the dispatch's ll_route output (LlCombineRoutedParams),
  // with no host-made row table.
  virtual void ll_combine_routed(const ep::LlCombineRoutedParams& params) = 0;
  // A dispatch's receive placed by the counts its sources announced (LlUnpackCountedParams,
  // ep/ll_counted.hpp), recv_count and layout_range written beside, with no host-made item list.
  virtual void ll_unpack_counted(const ep::LlUnpackCountedParams& params) = 0;
  // A combine's rows sent back to their sources by the dispatch's layout_range
  // (LlReturnCountedParams, ep/ll_counted.hpp), with no host-made run list.
  virtual void ll_return_counted(const ep::LlReturnCountedParams& params) = 0;
  // How many elements of two device arrays differ (MismatchParams): a combine's topk_idx
  // checked against its dispatch's without either reaching the host.
  virtual void count_mismatches(const ep::MismatchParams& params) = 0;
  // The lengths (and ops) of a step's writes to other nodes from the counts the step computed
  // (SizeWritesParams, ep/ll_counted.hpp), in descriptors a later ring_push() reads.
  virtual void ll_write_bytes(const ep::SizeWritesParams& params) = 0;

  // Descriptor rings (gpu_side/ring.hpp), drained by the proxies as a host producer's are, so
  // that what kernels wrote is handed to the proxies in stream order, with no host in between.
  // attach_ring() makes this stream the producer of `ring`: a multi-producer ring (the mode GPU
  // producers need: cuda/ring_producer.cuh) whose memory is registered with this runtime and
  // that has no other producer. ring_push() queues the push of `count` descriptors from
  // `descriptors` (device memory or registered host memory) at consecutive positions, in
  // order, after the work queued before it; the header's producer head says how many were
  // pushed once it ran (quiet() counts them). A push that finds no room for `timeout` gives up:
  // it marks the ring abandoned (its consumer's health() then reports the producer failed, which
  // fails the proxy's waits, naming it) and drops the rest of the batch; the stream goes on (a
  // dead proxy must not kill the GPU context). The producer must outlive the pushes queued on
  // it (synchronize() first).
  virtual std::unique_ptr<DeviceRingProducer> attach_ring(const Ring& ring) = 0;
  virtual void ring_push(DeviceRingProducer& producer, const Descriptor* descriptors, int64_t count,
                         std::chrono::milliseconds timeout) = 0;

  // Signal words: the stream's side of a handshake with the host (the proxies, the ordering
  // layer) or a node peer, queued like every operation, so that a protocol whose waits are on
  // the stream needs no host thread between its steps (what a CUDA graph can capture: DeepEP's
  // low-latency hooks). A word is a 64-bit counter, 8-byte aligned, in registered host memory
  // or device memory, that its writers only raise (the host with an atomic release store or
  // fetch_add).
  // wait_value() makes the stream's later operations run only once the word holds at least
  // `value`. A word still short of it `timeout` after the wait began fails the stream (sticky:
  // reached(), wait_for() and synchronize() throw, naming `phase`, the word, what it held and
  // what was awaited) instead of hanging it; the operations behind a failed wait do not hang
  // either (the simulated device skips them; CUDA runs them on whatever is there, and the
  // failure is what the host reports).
  // write_value() stores `value` in the word once the operations queued before it ran, after
  // what they wrote is visible to the host (release, system scope): what a proxy acquiring the
  // word may read. Not behind a failed wait: what it let run is not signalled as done.
  // add_value() adds `delta` to the word once the operations before it ran (an atomic add,
  // release): the stream advancing an epoch word, the numbering a replayed graph's signals
  // take their values from (signal_value.hpp: a value of {epoch, offset} is read when the
  // operation runs, not when it is queued).
  // `waited_ns`, when given (an int64 in device memory, 8-byte aligned): the wait adds the
  // nanoseconds it spent before the word held the value to it (DeepEP's wait-cost statistics).
  // Each throws proxyep::Error(phase) at once, before anything is queued, for a word (or an
  // epoch word, or a waited_ns) the device cannot reach or that is misaligned.
  virtual void wait_value(const uint64_t* word, SignalValue value,
                          std::chrono::milliseconds timeout, std::string_view phase,
                          int64_t* waited_ns = nullptr) = 0;
  virtual void write_value(uint64_t* word, SignalValue value, std::string_view phase) = 0;
  virtual void add_value(uint64_t* word, uint64_t delta, std::string_view phase) = 0;

  // Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture, then cudaGraphLaunch): what
  // DeepEP's low-latency path allows, so that a step's communication replays with no host
  // between its operations. Between begin_capture() and end_capture() the operations queued on
  // this stream are recorded, not run; end_capture() returns them as a graph, and launch()
  // queues the whole sequence again, as often as wanted, in stream order, on the addresses and
  // values it was captured with (memory and words a graph uses must outlive its launches; the
  // simulated device keeps memory dropped during the capture until the graph is gone, as a
  // graph's own allocations are).
  // Another stream of the device joins a capture as on CUDA (a fork): wait_event() for an event
  // recorded inside the capture makes its later operations part of the same graph, after that
  // point; capturing() is then true for it too. It must be joined back before end_capture()
  // (which only the stream that began the capture may call): the capturing stream waits for an
  // event the joined one recorded after its last operation; else end_capture() throws (the
  // capture is invalid) naming the stream not joined back. This is how work queued on a
  // Buffer's stream becomes part of a caller's capture (torch.cuda.graph captures the caller's
  // stream): the Buffer's stream waits for the caller's point (previous_event), the caller's
  // stream for the call's end.
  // A graph holds no host: inside the capture the host may not wait for the stream
  // (synchronize, wait_for, reached), a stream may not wait for an event recorded outside it,
  // and a copy may not read or write plain host memory. Such a call throws proxyep::Error(phase) at
  // once and invalidates the capture: end_capture() then throws, naming what did, and the stream
  // runs its operations as queued again. Begin while capturing, end or launch without a
  // capture or inside one, a graph of another device: refused likewise, at once. The defaults
  // refuse: a runtime that cannot capture.
  virtual void begin_capture(std::string_view phase) {
    fail(std::string(phase), "a {} device cannot capture its stream into a graph", kind());
  }
  virtual std::unique_ptr<DeviceGraph> end_capture(std::string_view phase) {
    fail(std::string(phase), "a {} device cannot capture its stream into a graph", kind());
  }
  virtual void launch(const DeviceGraph& graph, std::string_view phase) {
    (void)graph;
    fail(std::string(phase), "a {} device cannot launch a graph", kind());
  }
  // Whether the stream is being captured (cudaStreamIsCapturing).
  virtual bool capturing() const { return false; }
  // While this thread captures a stream, a setup the graph does not hold (allocations, uploads
  // and waits on another stream of the device, shared memory for node peers) must not touch the
  // capture: CUDA's thread-local capture mode refuses such calls from the capturing thread and
  // invalidates the capture. Until the returned scope is dropped this thread may make them
  // (CUDA: cudaThreadExchangeStreamCaptureMode to relaxed, and back); the operations of the
  // capturing stream are still captured, and its host waits still refused. The default: nothing
  // to relax.
  virtual std::shared_ptr<void> relax_capture() { return nullptr; }

  // Events order two streams of one device (the caller's compute stream and a Buffer's, as
  // DeepEP's previous_event does). record() marks the point after everything queued so far;
  // wait_event() makes this stream's later operations run after `event`'s point, which another
  // runtime on the same device recorded. The wait is queued, not performed: a point never
  // reached (a stream that stalled) fails this stream within `timeout` where the runtime can
  // bound it (the simulated device), else at synchronize()'s deadline (CUDA).
  virtual std::shared_ptr<DeviceEvent> record() = 0;
  virtual void wait_event(const std::shared_ptr<DeviceEvent>& event,
                          std::chrono::milliseconds timeout) = 0;

  // The host's side of an event this runtime recorded: reached() says, without blocking,
  // whether its stream has run everything queued before it (cudaEventQuery); wait_for() blocks
  // until it has, for at most `timeout`. Both throw proxyep::Error(phase) for a failed stream
  // (naming the operation), wait_for() also at the deadline. A backend publishes what its
  // kernels wrote (to the proxies, to a peer) only once their event is reached.
  virtual bool reached(const DeviceEvent& event, std::string_view phase) = 0;
  virtual void wait_for(const DeviceEvent& event, std::string_view phase,
                        std::chrono::milliseconds timeout) = 0;

  // Waits until everything queued has run, for at most `timeout`; throws proxyep::Error(phase)
  // for a failed operation (then the runtime is unusable, as a CUDA context is after a fault)
  // or a stream still busy at the deadline (then it may be called again).
  virtual void synchronize(std::string_view phase, std::chrono::milliseconds timeout) = 0;
};

}  // namespace proxyep::gpu_side::device
