// DeviceCapture: a DeviceRuntime's stream (device_runtime.hpp) recorded into a graph and replayed
// (CUDA graphs), what DeepEP's low-latency path allows.
#pragma once

#include "common/error.hpp"

#include <memory>
#include <string>
#include <string_view>

namespace proxyep::gpu_side::device {

// A stream's captured operations (a cudaGraphExec_t), from DeviceRuntime::end_capture(). Opaque:
// only a runtime of the same kind and device launches it.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

class DeviceCapture {
 public:
  virtual ~DeviceCapture() = default;

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
    fail(std::string(phase), "this device cannot capture its stream into a graph");
  }
  virtual std::unique_ptr<DeviceGraph> end_capture(std::string_view phase) {
    fail(std::string(phase), "this device cannot capture its stream into a graph");
  }
  virtual void launch(const DeviceGraph& graph, std::string_view phase) {
    (void)graph;
    fail(std::string(phase), "this device cannot launch a graph");
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
};

}  // namespace proxyep::gpu_side::device
