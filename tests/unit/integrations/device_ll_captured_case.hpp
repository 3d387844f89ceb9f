// Low-latency calls captured into graphs (integrations/low_latency/ll_captured.hpp) on any
// DeviceRuntime, ranks as threads of one node: each rank captures a dispatch and its combine on
// the Buffer's device stream (two graphs: the expert outputs are the test's, between them), then
// launches them for three rounds of new inputs written into the same tensors, and three times
// back to back with no host in between; the static outputs pass the exact checks
// (ll_case_checks.hpp) every time, and DeepEP's statistics tensors add up over the launches (the
// tokens each expert received exactly; the wait times, some). Or the caller's stream captures, as
// torch.cuda.graph does, and the Buffer's stream joins (the calls given a previous_event recorded
// inside the capture, the caller's stream waiting for each call's event). With return_recv_hook,
// each call's hook is called inside its capture (its receive queued there; the caller joins back
// at the hook's point). What cannot be captured is refused before anything is queued and the
// capture stays valid: async_finish, a hook called outside a capture, a combine before its
// dispatch's hook, a previous_event recorded outside the capture, zero_copy before a combine
// buffer was asked for, a combine's topk_idx
// that is not the dispatch's tensor, a captured dispatch's combine outside a capture, a second
// combine of one dispatch. With ranks on other nodes, the same through the proxies (the step
// transport's writes, counted in signal words). Run on the host-simulated device by
// test_device_buffer_threads.cpp and on CUDA by tests/gpu/test_gpu_buffer.cpp.
#pragma once

#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"
#include "tests/unit/integrations/device_test_tensors.hpp"
#include "tests/unit/integrations/ll_case_checks.hpp"

#include <functional>
#include <memory>
#include <string>

namespace proxyep::integrations::testing::ll {

// Refused inside a capture, naming `words`; the capture is still valid afterwards (it ends
// into a graph that does nothing harmful when dropped).
inline void refused_in_capture(gpu_side::device::DeviceRuntime& dev,
                               const std::function<void()>& call, const std::string& words) {
  dev.begin_capture("test refusal");
  const std::string error = error_of(call);
  std::unique_ptr<gpu_side::device::DeviceGraph> graph;
  const std::string ended = error_of([&] { graph = dev.end_capture("test refusal"); });
  require_mentions(error, words);
  require(ended.empty(), "test", "the capture was left invalid by a refusal: {}", ended);
}

// The Buffer of these cases: low-latency calls of the case's sizes on `device`.
inline BufferOptions captured_options(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, int ranks_per_node,
    bool shrink) {
  BufferOptions o;
  o.low_latency_mode = true;
  o.enable_shrink = shrink;
  o.ranks_per_node = ranks_per_node;
  o.num_rdma_bytes =
      Buffer::get_low_latency_rdma_size_hint(kTokens, kHidden, kRanks, kLocal * kRanks);
  o.device = device;
  return o;
}

inline LowLatencyDispatchArgs dispatch_args(const ep::Tensor& x, const ep::Tensor& idx) {
  LowLatencyDispatchArgs d;
  d.x = x;
  d.topk_idx = idx;
  d.num_max_dispatch_tokens_per_rank = kTokens;
  d.num_experts = kLocal * kRanks;
  return d;
}

inline void run_captured_ll_rank(control::Bootstrap::Options options,
                                 const DeviceFactory& make_device, bool joined, bool hooked,
                                 bool zero_copy, int ranks_per_node) {
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  const RankDevice devices = make_device(me);
  gpu_side::device::DeviceRuntime& dev = *devices.buffer;
  gpu_side::device::DeviceRuntime& caller = *devices.caller;
  Buffer buffer(*boot, captured_options(devices.buffer, ranks_per_node, false));

  // The graphs' tensors: fixed device memory, rewritten by the caller before each launch.
  const auto first = inputs(1);
  const ep::Tensor x = upload(dev, first[me].x), idx = upload(dev, first[me].topk_idx),
                   weights = upload(dev, first[me].topk_weights);
  const ep::Tensor expert_out =
      upload(dev, ep::Tensor::zeros(ep::DType::bf16, int64_t{kLocal} * kRanks * kTokens, kHidden));
  const ep::Tensor out = upload(dev, ep::Tensor::zeros(ep::DType::bf16, kTokens, kHidden));
  const LowLatencyDispatchArgs d = dispatch_args(x, idx);

  LowLatencyDispatchArgs async = d;
  async.async_finish = true;
  refused_in_capture(
      dev, [&] { buffer.low_latency_dispatch(async); }, "async_finish cannot be captured");
  if (hooked) {
    // A hooked dispatch's receive is queued by its hook, inside a capture only; its combine
    // cannot be captured before. (Its graph is never launched: no peer waits for it.)
    LowLatencyDispatchArgs with_hook = d;
    with_hook.return_recv_hook = true;
    dev.begin_capture("test hook refusals");
    const LowLatencyDispatchResult sent = buffer.low_latency_dispatch(with_hook);
    (void)dev.end_capture("test hook refusals");
    require_mentions(error_of([&] { sent.hook(); }),
                     "the hook of a captured call queues its receive into the capture");
    require(sent.hook.device_point() == nullptr, "test", "a refused hook has a device point");
    LowLatencyCombineArgs early{
        .x = upload(
            dev, ep::Tensor::zeros(ep::DType::bf16, int64_t{kLocal} * kRanks * kTokens, kHidden)),
        .topk_idx = idx,
        .topk_weights = weights,
        .handle = &sent.handle};
    refused_in_capture(
        dev, [&] { buffer.low_latency_combine(early); },
        "the dispatch's receive was never queued: call its hook");
  }
  LowLatencyDispatchArgs after = d;
  after.previous_event = caller.record();
  refused_in_capture(
      dev, [&] { buffer.low_latency_dispatch(after); },
      "previous_event was recorded outside the capture");

  // Capturing the Buffer's stream itself, or the caller's (as torch.cuda.graph does), which the
  // Buffer's stream joins through previous_event and the caller's joins back through the call's
  // event; the graphs then run on the capturing stream.
  gpu_side::device::DeviceRuntime& capturer = joined ? caller : dev;
  std::shared_ptr<gpu_side::device::DeviceEvent> fork;
  auto begin = [&](const char* name) {
    capturer.begin_capture(name);
    if (joined) fork = caller.record();
  };
  // The call's end: its event's point, or with a hook (called at once, in the same capture,
  // as DeepEP's two-batch overlap does between other work) the hook's.
  auto end = [&](const CallEvent& event, const RecvHook& hook, const char* name) {
    require(event.defined() && hook.defined() == hooked, "test",
            "a captured call returned no event, or {} hook", hooked ? "no" : "a");
    if (hooked) hook();
    const std::shared_ptr<gpu_side::device::DeviceEvent> point =
        hooked ? hook.device_point() : event.device_point();
    require(point != nullptr && point->captured(), "test",
            "a captured call's end is no point inside the graph");
    if (joined) caller.wait_event(point, kWait);
    return capturer.end_capture(name);
  };
  auto launch = [&](const gpu_side::device::DeviceGraph& graph, const char* name) {
    capturer.launch(graph, name);
    if (joined) caller.synchronize(name, kWait);  // the checks read through the Buffer's stream
  };

  // DeepEP's statistics, added on the device at every launch.
  const ep::Tensor recv_stats = upload(dev, ep::Tensor::zeros(ep::DType::i32, kLocal)),
                   dispatch_waits = upload(dev, ep::Tensor::zeros(ep::DType::i64, kRanks)),
                   combine_waits = upload(dev, ep::Tensor::zeros(ep::DType::i64, kRanks));
  begin("test dispatch");
  LowLatencyDispatchArgs joining = d;
  joining.previous_event = fork;
  joining.cumulative_local_expert_recv_stats = recv_stats;
  joining.dispatch_wait_recv_cost_stats = dispatch_waits;
  joining.return_recv_hook = hooked;
  LowLatencyDispatchResult dispatched = buffer.low_latency_dispatch(joining);
  const std::unique_ptr<gpu_side::device::DeviceGraph> dispatch_graph =
      end(dispatched.event, dispatched.hook, "test dispatch");
  require(dispatched.handle.captured != nullptr && dispatched.recv_x.device() == ep::Device::cuda,
          "test", "a captured dispatch returned no captured handle or host outputs");

  LowLatencyCombineArgs c{
      .x = expert_out, .topk_idx = idx, .topk_weights = weights, .handle = &dispatched.handle};
  c.out = out;
  require_mentions(error_of([&] { buffer.low_latency_combine(c); }),
                   "the handle came from a captured dispatch: its combine must be captured too");
  LowLatencyCombineArgs early_zero_copy = c;
  early_zero_copy.zero_copy = true;
  refused_in_capture(
      dev, [&] { buffer.low_latency_combine(early_zero_copy); },
      "zero_copy: no combine buffer yet (call get_next_low_latency_combine_buffer first)");
  const ep::Tensor idx_copy = upload(dev, first[me].topk_idx);
  LowLatencyCombineArgs other_idx = c;
  other_idx.topk_idx = idx_copy;
  refused_in_capture(
      dev, [&] { buffer.low_latency_combine(other_idx); },
      "topk_idx must be the tensor the captured dispatch routed");
  begin("test combine");
  // With zero_copy the expert outputs go into the combine buffer, asked for inside the capture.
  const ep::Tensor expert_in =
      zero_copy ? buffer.get_next_low_latency_combine_buffer(dispatched.handle) : expert_out;
  LowLatencyCombineArgs joining_combine = c;
  joining_combine.zero_copy = zero_copy;
  joining_combine.previous_event = fork;
  joining_combine.combine_wait_recv_cost_stats = combine_waits;
  joining_combine.return_recv_hook = hooked;
  const LowLatencyCombineResult combined = buffer.low_latency_combine(joining_combine);
  const std::unique_ptr<gpu_side::device::DeviceGraph> combine_graph =
      end(combined.event, combined.hook, "test combine");
  require(!combined.combined_x.defined(), "test", "a combine into `out` returned another tensor");
  refused_in_capture(
      dev, [&] { buffer.low_latency_combine(c); }, "this dispatch's combine was captured already");
  if (joined)  // a point of a capture that has ended: no graph to join
    require_mentions(error_of([&] { buffer.low_latency_dispatch(joining); }),
                     "the event was recorded inside a capture that has ended");

  // Host views of the static outputs after a launch.
  auto on_host = [&] { return dispatch_on_host(dev, dispatched); };
  auto write = [&](const ep::Tensor& to, const ep::Tensor& from) {
    dev.copy(const_cast<std::byte*>(to.raw()), from.raw(), from.bytes());
  };
  std::vector<ep::RankInputs> now;
  std::vector<int64_t> received(kLocal, 0);  // what recv_stats must hold
  auto count_received = [&](const LowLatencyDispatchResult& h, int launches) {
    for (int e = 0; e < kLocal; ++e)
      received[e] += int64_t{launches} * h.recv_count.data<int32_t>()[e];
  };
  for (uint64_t round = 0; round < 3; ++round) {
    now = inputs(round + 1);
    write(x, now[me].x);
    write(idx, now[me].topk_idx);
    write(weights, now[me].topk_weights);
    dev.synchronize("test inputs", kWait);
    launch(*dispatch_graph, "test dispatch");
    const LowLatencyDispatchResult h = on_host();
    check_dispatch(h, now, me);
    count_received(h, 1);
    const ep::Tensor outputs = expert_outputs(h, me);  // read by the copy until the download
    write(expert_in, outputs);
    dev.synchronize("test expert outputs", kWait);
    launch(*combine_graph, "test combine");
    check_combine(download(dev, out, "out"), now[me], me);
  }
  // Back to back, the host waiting only at the end: the ranks' graphs pace each other.
  dev.fill(const_cast<std::byte*>(out.raw()), 0, out.bytes());
  dev.synchronize("test fill", kWait);
  for (int i = 0; i < 3; ++i) {
    capturer.launch(*dispatch_graph, "test dispatch");
    capturer.launch(*combine_graph, "test combine");
  }
  if (joined) caller.synchronize("test launches", kWait);
  const LowLatencyDispatchResult last = on_host();
  check_dispatch(last, now, me);
  check_combine(download(dev, out, "out"), now[me], me);
  count_received(last, 3);
  const ep::Tensor stats = download(dev, recv_stats, "recv_stats");
  for (int e = 0; e < kLocal; ++e)
    require(stats.data<int32_t>()[e] == received[e], "test",
            "cumulative_local_expert_recv_stats[{}] is {} after the launches, not {}", e,
            stats.data<int32_t>()[e], received[e]);
  for (const auto& [waits, what] : {std::pair{dispatch_waits, "dispatch_wait_recv_cost_stats"},
                                    std::pair{combine_waits, "combine_wait_recv_cost_stats"}}) {
    const ep::Tensor ns = download(dev, waits, what);
    int64_t total = 0;
    for (int r = 0; r < kRanks; ++r) {
      require(ns.data<int64_t>()[r] >= 0, "test", "{}[{}] is negative", what, r);
      total += ns.data<int64_t>()[r];
    }
    require(total > 0, "test", "{} stayed 0 over six launches", what);
  }
  buffer.destroy();
}

// One rank of a group whose captured dispatch is refused, naming `words`, before anything is
// queued (the capture stays valid).
inline void run_captured_refusal_rank(control::Bootstrap::Options options,
                                      const DeviceFactory& make_device, int ranks_per_node,
                                      bool shrink, const std::string& words) {
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  const RankDevice devices = make_device(me);
  Buffer buffer(*boot, captured_options(devices.buffer, ranks_per_node, shrink));
  const auto in = inputs(1);
  const ep::Tensor x = upload(*devices.buffer, in[me].x),
                   idx = upload(*devices.buffer, in[me].topk_idx);
  const LowLatencyDispatchArgs d = dispatch_args(x, idx);
  refused_in_capture(
      *devices.buffer, [&] { buffer.low_latency_dispatch(d); }, words);
  buffer.destroy();
}

// Rank masking (enable_shrink): a masked rank's steps would never be signalled, on one node or
// between nodes.
inline void run_captured_ll_refused(const DeviceFactory& make_device) {
  for (const int ranks_per_node : {kRanks, 1})
    run_buffer_ranks(kRanks, true, [make_device, ranks_per_node](control::Bootstrap::Options o) {
      run_captured_refusal_rank(std::move(o), make_device, ranks_per_node, true,
                                "a Buffer with enable_shrink cannot capture low-latency calls");
    });
}

// A rank whose device shares no memory (no CUDA IPC): every rank refuses the captured call
// alike, naming who cannot reach whom, instead of one failing and the others waiting for it.
// (With `make_device` giving rank 1 such a device, rank 0 cannot open rank 1's memory, and rank
// 1 has none of its own.)
inline void run_captured_ll_without_shared_memory(const DeviceFactory& make_device) {
  run_buffer_ranks(kRanks, false, [make_device](control::Bootstrap::Options o) {
    run_captured_refusal_rank(
        std::move(o), make_device, kRanks, false,
        "ranks 0 1 cannot reach every rank's step memory (this rank misses ranks ");
  });
}

// `joined`: the caller's stream captures, the Buffer's joins it (else the Buffer's captures).
// `hooked`: the calls pass return_recv_hook and call their hooks inside the capture.
// `zero_copy`: the combine reads the expert outputs from the combine buffer.
// `ranks_per_node` below kRanks: the group spans nodes, whose ranks the steps reach through the
// proxies (over `fabric`, with the reorder shim on: completions come out of order).
inline void run_captured_ll(const DeviceFactory& make_device, bool joined, bool hooked = false,
                            bool zero_copy = false, int ranks_per_node = kRanks,
                            const std::string& fabric = "tcp") {
  run_buffer_ranks(
      kRanks, ranks_per_node < kRanks,
      [make_device, joined, hooked, zero_copy, ranks_per_node](control::Bootstrap::Options o) {
        run_captured_ll_rank(std::move(o), make_device, joined, hooked, zero_copy, ranks_per_node);
      },
      fabric);
}

}  // namespace proxyep::integrations::testing::ll
