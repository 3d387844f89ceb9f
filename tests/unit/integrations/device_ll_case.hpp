// Low-latency calls with device tensors (integrations/device_ll_calls.hpp) on any DeviceRuntime,
// ranks as threads (node peers, or over the fabric with the reorder shim): a dispatch with a hook
// and one with async_finish in flight together, the cumulative statistics written in place on the
// device, a combine with async_finish and a zero_copy one through the device combine buffer with
// a hook and `out` (their inputs overwritten by the caller's stream as soon as they return), the
// wait statistics added on the device, a mask query into a device tensor, and the calls mixing
// host and device memory, a topk_idx naming no expert and a combine's topk_idx that differs from
// its dispatch's (both found on the device) refused on every rank before anything is sent, as are
// a captured call with statistics tensors and one after an event recorded in a capture.
// Outputs are downloaded and checked exactly against gpu_side/ep/ll_reference.hpp
// (ll_case_checks.hpp). Run on the host-simulated device by test_device_buffer_threads.cpp and on
// CUDA by tests/gpu/test_gpu_buffer.cpp.
#pragma once

#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"
#include "tests/unit/integrations/device_test_tensors.hpp"
#include "tests/unit/integrations/ll_case_checks.hpp"

#include <string>

namespace proxyep::integrations::testing::ll {

// `nic_device_memory`: the fabric registers device memory (FI_HMEM) and the device offers memory
// a NIC reads, so other nodes' messages must land in the receivers' device arenas too.
inline void run_device_ll_rank(int per_node, control::Bootstrap::Options options,
                               const DeviceFactory& make_device, bool nic_device_memory = false) {
  uint64_t device_calls = 0;  // dispatches and combines with device tensors
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  const RankDevice devices = make_device(me);
  const std::shared_ptr<gpu_side::device::DeviceRuntime>& device = devices.buffer;
  gpu_side::device::DeviceRuntime& caller = *devices.caller;
  gpu_side::device::DeviceRuntime& dev = *device;
  BufferOptions o;
  o.low_latency_mode = true;
  o.enable_shrink = true;  // for the mask query
  o.ranks_per_node = per_node;
  o.num_rdma_bytes =
      Buffer::get_low_latency_rdma_size_hint(kTokens, kHidden, kRanks, kLocal * kRanks);
  o.device = device;
  Buffer buffer(*boot, o);

  const ep::Tensor recv_stats = upload(dev, ep::Tensor::zeros(ep::DType::i32, kLocal));
  const ep::Tensor wait_stats = upload(dev, ep::Tensor::zeros(ep::DType::i64, kRanks));
  const ep::Tensor combine_wait_stats = upload(dev, ep::Tensor::zeros(ep::DType::i64, kRanks));
  std::vector<int32_t> received(kLocal, 0);
  for (uint64_t round = 0; round < 2; ++round) {
    const auto a = inputs(2 * round + 1), b = inputs(2 * round + 2);
    const ep::Tensor xa = upload(dev, a[me].x), ia = upload(dev, a[me].topk_idx),
                     wa = upload(dev, a[me].topk_weights), xb = upload(dev, b[me].x),
                     ib = upload(dev, b[me].topk_idx), wb = upload(dev, b[me].topk_weights);
    auto args = [&](const ep::Tensor& x, const ep::Tensor& idx) {
      LowLatencyDispatchArgs d;
      d.x = x;
      d.topk_idx = idx;
      d.num_max_dispatch_tokens_per_rank = kTokens;
      d.num_experts = kLocal * kRanks;
      d.cumulative_local_expert_recv_stats = recv_stats;
      d.dispatch_wait_recv_cost_stats = wait_stats;
      return d;
    };
    if (round == 0) {
      LowLatencyDispatchArgs mixed = args(xa, ia);
      mixed.x = a[me].x;
      require_mentions(error_of([&] { buffer.low_latency_dispatch(mixed); }),
                       "topk_idx is in device memory but x is in host memory");
      // topk_idx never reaches the host: a value naming no expert is found by the device's
      // routing, and refused before anything is sent.
      ep::Tensor bad = a[me].topk_idx.clone();
      bad.data<int64_t>()[bad.numel() - 1] = kLocal * kRanks;
      require_mentions(error_of([&] { buffer.low_latency_dispatch(args(xa, upload(dev, bad))); }),
                       "1 of topk_idx's 32 values are neither -1 nor an expert id in [0, 4)");
      // A call made while the Buffer's stream captures, or given an event recorded inside a
      // capture, is a captured one: refused here before anything is queued (the capture ends
      // valid), as this Buffer shrinks or spans nodes (device_ll_captured_case.hpp has the
      // captured calls that run).
      dev.begin_capture("test capture");
      require_mentions(error_of([&] { buffer.low_latency_dispatch(args(xa, ia)); }),
                       "low_latency_dispatch (captured): ");
      (void)dev.end_capture("test capture");
      caller.begin_capture("caller capture");
      LowLatencyDispatchArgs after_graph = args(xa, ia);
      after_graph.previous_event = caller.record();
      after_graph.cumulative_local_expert_recv_stats = {};
      after_graph.dispatch_wait_recv_cost_stats = {};
      (void)caller.end_capture("caller capture");
      require_mentions(error_of([&] { buffer.low_latency_dispatch(after_graph); }),
                       "low_latency_dispatch (captured): ");
    }
    // The hooked dispatch's x as the caller's stream makes it, waited for through previous_event.
    const ep::Tensor xa_late = produce_on(caller, a[me].x);
    LowLatencyDispatchArgs hooked = args(xa_late, ia), async = args(xb, ib);
    hooked.previous_event = caller.record();
    hooked.return_recv_hook = true;
    async.async_finish = true;
    LowLatencyDispatchResult da = buffer.low_latency_dispatch(hooked);
    LowLatencyDispatchResult db = buffer.low_latency_dispatch(async);
    device_calls += 2;
    require(da.recv_x.device() == ep::Device::cuda && da.handle.device == ep::Device::cuda, "test",
            "a device dispatch returned host outputs");
    // Every output is device memory, the handle's src_info and layout_range too (as DeepEP's):
    // host views of them for the checks, read from the caller's stream (a call whose hook
    // returned, or whose event was waited for, has finished its device work).
    auto on_host = [&](const LowLatencyDispatchResult& d) { return dispatch_on_host(caller, d); };
    // The async dispatch, waited for as ep.async_wait says (the caller's stream at its device
    // point, never this thread; or the host): the CommStream's thread finishes it meanwhile;
    // its outputs must be complete where the caller reads them.
    caller_waits_for(caller, db.event, "dispatch");
    const LowLatencyDispatchResult hb = on_host(db);
    da.hook();
    const LowLatencyDispatchResult ha = on_host(da);
    for (const LowLatencyDispatchResult* d : {&ha, &hb}) {
      check_dispatch(*d, d == &ha ? a : b, me);
      for (int e = 0; e < kLocal; ++e)
        received[static_cast<size_t>(e)] += d->recv_count.data<int32_t>()[e];
    }
    const ep::Tensor stats = download(dev, recv_stats, "cumulative_local_expert_recv_stats");
    for (int e = 0; e < kLocal; ++e)
      require(stats.data<int32_t>()[e] == received[static_cast<size_t>(e)], "test",
              "cumulative_local_expert_recv_stats[{}] is {}, the calls received {}", e,
              stats.data<int32_t>()[e], received[static_cast<size_t>(e)]);

    // Combine a with async_finish; b zero_copy through the device combine buffer, with a hook
    // and `out`.
    const ep::Tensor outputs_a = upload(dev, expert_outputs(ha, me));
    LowLatencyCombineArgs ca{
        .x = outputs_a, .topk_idx = ia, .topk_weights = wa, .handle = &da.handle};
    ca.async_finish = true;
    ca.combine_wait_recv_cost_stats = combine_wait_stats;
    if (round == 0) {
      // The device combine buffer does not exist yet: refused, not a combine of zeros.
      const LowLatencyCombineArgs early{
          .topk_idx = ib, .topk_weights = wb, .handle = &db.handle, .zero_copy = true};
      require_mentions(error_of([&] { buffer.low_latency_combine(early); }),
                       "get_next_low_latency_combine_buffer");
    }
    if (round == 0) {
      // The combine's topk_idx is compared with its dispatch's on the device; a host-tensor
      // combine cannot follow a device dispatch's routing.
      ep::Tensor other = a[me].topk_idx.clone();
      other.data<int64_t>()[0] = other.data<int64_t>()[0] == 0 ? 1 : 0;
      const ep::Tensor other_on_device = upload(dev, other);
      LowLatencyCombineArgs differs = ca;
      differs.topk_idx = other_on_device;
      require_mentions(error_of([&] { buffer.low_latency_combine(differs); }),
                       "topk_idx differs from the one this handle's dispatch routed by in 1 of");
      const ep::Tensor host_x = expert_outputs(ha, me);
      const LowLatencyCombineArgs host_tensors{.x = host_x,
                                               .topk_idx = a[me].topk_idx,
                                               .topk_weights = a[me].topk_weights,
                                               .handle = &da.handle};
      require_mentions(error_of([&] { buffer.low_latency_combine(host_tensors); }),
                       "the handle came from a dispatch with device tensors; its combine must "
                       "pass device tensors too");
    }
    const ep::Tensor combine_buffer = buffer.get_next_low_latency_combine_buffer(db.handle);
    require(combine_buffer.device() == ep::Device::cuda, "test",
            "the combine buffer of a device dispatch is host memory");
    const ep::Tensor outputs_b = expert_outputs(hb, me);
    dev.copy(const_cast<std::byte*>(combine_buffer.raw()), outputs_b.raw(), outputs_b.bytes());
    dev.synchronize("test combine buffer", kWait);
    const ep::Tensor out = upload(dev, ep::Tensor::zeros(ep::DType::bf16, kTokens, kHidden));
    LowLatencyCombineArgs cb{.x = combine_buffer,
                             .topk_idx = ib,
                             .topk_weights = wb,
                             .handle = &db.handle,
                             .zero_copy = true,
                             .out = out};
    cb.return_recv_hook = true;
    if (round == 0) {
      LowLatencyCombineArgs host_tensors = cb;
      host_tensors.topk_idx = b[me].topk_idx;
      host_tensors.topk_weights = b[me].topk_weights;
      host_tensors.out = {};
      require_mentions(error_of([&] { buffer.low_latency_combine(host_tensors); }),
                       "zero_copy: the handle came from a dispatch with device tensors");
    }
    LowLatencyCombineResult ra = buffer.low_latency_combine(ca);
    LowLatencyCombineResult rb = buffer.low_latency_combine(cb);
    device_calls += 2;
    // Both have read their inputs on the device before returning (as DeepEP's send kernels have
    // by then, and the weights are copied): the caller's stream overwrites them at once.
    for (const ep::Tensor* t : {&outputs_a, &wa, &combine_buffer, &wb})
      caller.fill(const_cast<std::byte*>(t->raw()), 0xff, t->bytes());
    caller.synchronize("test caller stream", kWait);
    rb.hook();
    caller_waits_for(caller, ra.event, "combine");
    require(!rb.combined_x.defined(), "test", "a combine into `out` returned another tensor");
    require(ra.combined_x.device() == ep::Device::cuda, "test",
            "a device combine returned a host tensor");
    check_combine(download(caller, ra.combined_x, "combined_x"), a[me], me);
    check_combine(download(caller, out, "out"), b[me], me);
  }
  // The wait statistics: nanoseconds added per source rank on the device by every call.
  for (const ep::Tensor* stats : {&wait_stats, &combine_wait_stats}) {
    const ep::Tensor waited = download(caller, *stats, "wait statistics");
    int64_t total = 0;
    for (int r = 0; r < kRanks; ++r) {
      require(waited.data<int64_t>()[r] >= 0, "test", "a negative wait for rank {}", r);
      total += waited.data<int64_t>()[r];
    }
    require(total > 0, "test", "no wait was added to the {} statistics",
            stats == &wait_stats ? "dispatch" : "combine");
  }
  const ep::Tensor mask = upload(dev, ep::Tensor::zeros(ep::DType::i32, kRanks));
  dev.fill(const_cast<std::byte*>(mask.raw()), 7, mask.bytes());
  buffer.low_latency_query_mask_buffer(mask);
  const ep::Tensor masked = download(caller, mask, "mask_status");
  for (int r = 0; r < kRanks; ++r)
    require(masked.data<int32_t>()[r] == 0, "test", "rank {} reads as masked", r);
  caller.synchronize("test caller stream", kWait);
  // (A node daemon's shim is its own: its sessions report none.)
  if (per_node == 1 && params::proxy_mode.get() != "daemon")
    require(buffer.stats().reordered_completions.has_value(), "test",
            "the fabric path ran without the reorder shim");
  // Over the fabric the device's stream hands the writes its kernels filled to the proxies
  // (proxy/session/device_route.hpp); node peers have none.
  const uint64_t from_device = buffer.stats().writes_from_device;
  require((per_node == 1) == (from_device > 0), "test",
          "{} writes went through the device's stream ({} ranks per node)", from_device, per_node);
  // Node peers' messages, and a rank's to itself, go into device arenas
  // (proxy/session/device_arenas.hpp).
  const uint64_t to_device_arenas = buffer.stats().sends_to_device_arenas;
  require(to_device_arenas > 0, "test", "no message went into a device arena");
  // Alone on its node a rank sends itself at most one payload per call; more went to other
  // nodes' device arenas (GPUDirect RDMA), which must happen exactly where nic_device_memory.
  if (per_node == 1)
    require(nic_device_memory == (to_device_arenas > device_calls), "test",
            "{} payloads into device arenas in {} calls (other nodes' device arenas {})",
            to_device_arenas, device_calls, nic_device_memory ? "expected" : "not expected");
  buffer.destroy();
}

inline void run_device_ll(int per_node, const DeviceFactory& make_device,
                          const std::string& provider = "tcp", bool nic_device_memory = false) {
  run_buffer_ranks(
      kRanks, per_node == 1,
      [per_node, make_device, nic_device_memory](control::Bootstrap::Options o) {
        run_device_ll_rank(per_node, std::move(o), make_device, nic_device_memory);
      },
      provider);
}

}  // namespace proxyep::integrations::testing::ll
