// CapturedLowLatency: low-latency calls made while the Buffer's device stream is being captured
// into a graph (DeepEP's LL path under CUDA graphs), on one node: captured itself
// (DeviceRuntime::begin_capture), or joining the capture of the caller's stream, the way
// torch.cuda.graph is used: a previous_event recorded inside that capture makes the Buffer's
// stream join it (DeviceRuntime::wait_event), and the call's event (CallEvent::device_point, a
// point inside the graph; wait() returns at once) is where the caller's stream joins it back
// (wait_event on it before ending the capture; Python's deep_ep does both). The host protocol
// cannot be captured (it reads the counts back and waits for records on the host), so a captured
// call queues the node's LL step instead (ll_node_dispatch.hpp,
// ll_node_combine.hpp): the routing, the sends into every peer's device memory, the epoch-numbered
// handshakes and the receive, all on the stream. Its outputs are static tensors, as a captured
// torch call's are: every launch of the graph rewrites them. DeepEP's statistics tensors are added
// into on the device at every launch (the step's counts; the nanoseconds its arrival waits took,
// per source rank).
//
// The step memory (every rank's slots, counts and words, shared through DeviceArenas: CUDA IPC)
// is made at the first captured call, collectively (every rank captures the same calls), for that
// call's sizes (every rank's must agree: refused naming the ranks that differ), zeroed, and kept
// while the Buffer lives; so is each captured call's step, which its graph uses at every launch
// (a graph launched after its Buffer is gone reads freed memory, as with DeepEP). Every rank
// must launch its graphs as often as the others.
//
// Between nodes (a group that spans nodes; the proxy threads in this process or the node
// daemon's), the node peers are
// reached as on one node and the ranks on other nodes through the session's step transport
// (proxy/session/step_link.hpp: step memory every rank registered with the fabric, signal words the
// proxies count, a ring the stream pushes into), made collectively at the first captured call
// too: the step packs a remote peer's messages into this rank's send slot for it and pushes the
// writes (messages, counts row; the rows back in the combine) into the peer's receive slot for
// this rank, sized on the device from the counts; each write's immediate names the peer's signal
// word that counts it, and the releases go back as signals (ll_node_*.hpp).
//
// Refused before anything is queued, naming why: a peer whose device memory this rank cannot
// open, rank masking (enable_shrink), async_finish (the graph is the asynchrony), a
// previous_event recorded outside the capture, sizes other than the first captured call's, a
// combine of a dispatch that was not captured (or a captured dispatch's combine outside a capture),
// a combine whose topk_idx is not the dispatch's tensor, and a combine of a dispatch whose hook was
// not called yet.
//
// return_recv_hook (DeepEP's two-batch overlap under CUDA graphs): the call queues the step's
// send half; its hook, called while the Buffer's stream captures (the same capture or a later
// one), queues the receive half there, and its device_point() is where that receive ends (the
// capturing stream joins it back, as the call's event). Refused outside a capture.
#pragma once

#include "control/bootstrap.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "integrations/low_latency/ll_node_combine.hpp"
#include "integrations/low_latency/ll_node_dispatch.hpp"
#include "integrations/low_latency/ll_record.hpp"
#include "integrations/low_latency_types.hpp"
#include "proxy/session/device_arenas.hpp"
#include "proxy/session/session.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace proxyep::integrations::low_latency {

// A captured dispatch, kept by the Buffer and by its handle (LowLatencyHandle::captured).
struct CapturedDispatch {
  std::unique_ptr<LlNodeDispatch> step;
  gpu_side::ep::TensorRef topk_idx;  // the tensor it routed (the combine must pass it)
  std::vector<gpu_side::ep::Tensor> outputs;
  bool received = false;  // its receive is queued (at once, or by its hook)
  // Its combine, made by the first captured combine of its handle.
  std::unique_ptr<LlNodeCombine> combine;
  gpu_side::ep::Tensor combined;
};

class CapturedLowLatency {
 public:
  CapturedLowLatency(control::Bootstrap& bootstrap, proxy::Session& session, bool enable_shrink)
      : bootstrap_(bootstrap), session_(session), shrink_(enable_shrink) {}

  LowLatencyDispatchResult dispatch(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                    const LowLatencyDispatchArgs& args);
  // The shape of a captured dispatch's combine buffer (DeepEP's [E_local * R*T, H]). Throws
  // proxyep::Error for a handle another Buffer made.
  std::pair<int64_t, int64_t> combine_buffer_shape(const LowLatencyHandle& handle) const;
  // `combine_buffer`: what a zero_copy combine reads (the Buffer's device combine buffer).
  LowLatencyCombineResult combine(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  const LowLatencyCombineArgs& args,
                                  const gpu_side::ep::TensorRef& combine_buffer);

 private:
  // The step memory for `shape`, made collectively at the first captured call.
  void open_memory(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                   const LlShape& shape, const char* phase);
  struct Layout {
    uint64_t slot_bytes = 0, return_bytes = 0;
    uint64_t returns_at = 0, counts_at = 0, words_at = 0, bytes = 0;
    // The step transport's memory (between nodes): per rank on another node, in rank order,
    // `remote_stride` bytes holding its receive and send slots and counts rows at these offsets.
    uint64_t recv_slot_at = 0, send_slot_at = 0, recv_return_at = 0, send_return_at = 0;
    uint64_t recv_counts_at = 0, send_counts_at = 0, remote_stride = 0, remote_bytes = 0;
  };
  static Layout layout_for(const LlShape& shape, int ranks, int remotes);
  LlNodeMemory dispatch_memory(int rank) const;
  LlNodeReturnMemory return_memory(int rank) const;
  uint64_t* epoch(int which) const;  // this rank's: 0 the dispatch's, 1 the combine's
  // Between nodes: the peers on other nodes' memory and words, and the writes to them.
  std::vector<LlRemotePeer> remote_peers() const;
  std::vector<LlRemoteReturn> remote_homes() const;
  LlRemoteSends dispatch_sends() const;
  LlRemoteSends combine_sends() const;
  std::vector<int> remote_ranks() const;  // the ranks on other nodes, ascending
  // Where rank `of`'s memory is among the peers on other nodes of rank `at` (its offset in
  // at's step transport memory), and the descriptor of a write from this rank to `to`.
  uint64_t remote_base(int of, int at) const;
  gpu_side::Descriptor write_to(int to, uint64_t from_offset, uint64_t to_offset, uint64_t bytes,
                                uint32_t word) const;

  // Dropped with the Buffer: the captured calls' hooks refuse to queue after that.
  std::shared_ptr<void> alive_ = std::make_shared<int>(0);
  control::Bootstrap& bootstrap_;
  proxy::Session& session_;
  bool shrink_;
  std::optional<LlShape> shape_;
  Layout layout_;
  std::unique_ptr<proxy::DeviceArenas> memory_;
  std::optional<proxy::StepLink> link_;                        // between nodes
  std::vector<std::shared_ptr<CapturedDispatch>> dispatches_;  // every captured call's
};

}  // namespace proxyep::integrations::low_latency
