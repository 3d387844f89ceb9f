// Buffer calls with device tensors (integrations/device_calls.hpp) on any DeviceRuntime, ranks
// as threads (a real TCP bootstrap on loopback, real shared arenas, a real fabric with the
// reorder shim when the ranks are on different "nodes"): get_dispatch_layout on the device,
// a call mixing host and device tensors refused, dispatch (fresh and cached, with async_finish)
// and combine (async) with device inputs returning device outputs, checked exactly against
// gpu_side/ep/reference.hpp, and one call with host tensors on rank 0 and device tensors on
// the others. Run on the host-simulated device by
// tests/unit/integrations/test_device_buffer_threads.cpp and on CUDA by
// tests/gpu/test_gpu_buffer.cpp.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"
#include "tests/unit/integrations/device_test_tensors.hpp"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace proxyep::integrations::testing {

namespace ep = gpu_side::ep;

inline constexpr int kRanks = 2;
inline constexpr int kTokens = 40;
inline constexpr int kHidden = 512;

// One rank: `make_device(rank)` gives the rank's device; the Buffer holds `sized_for` tokens per
// rank in one chunk (fewer than kTokens: the rows stream in chunks that reuse the slots).
// `nic_device_memory`: the fabric registers device memory (FI_HMEM) and the device offers memory
// the NIC reads: then the device calls' chunks to other nodes must be written straight from
// device staging, and their eager bytes and chunks land in the receivers' device arenas; else
// neither may happen.
inline void run_device_buffer_rank(int per_node, control::Bootstrap::Options options,
                                   const DeviceFactory& make_device, int sized_for,
                                   bool nic_device_memory = false) {
  // Chunks only without eager rows (ep.eager_bytes 0).
  const bool device_chunks = nic_device_memory && params::ep_eager_bytes.get() == 0;
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank(), ranks = boot->world_size();
  const RankDevice devices = make_device(me);
  const std::shared_ptr<gpu_side::device::DeviceRuntime>& device = devices.buffer;
  gpu_side::device::DeviceRuntime& caller = *devices.caller;
  BufferOptions o;
  o.ranks_per_node = per_node;
  o.num_nvl_bytes = Buffer::nvl_bytes_hint(sized_for, kHidden * 2, 3, ranks);
  o.num_rdma_bytes =
      per_node < ranks ? Buffer::rdma_bytes_hint(sized_for, kHidden * 2, 3, ranks, per_node) : 0;
  o.device = device;
  Buffer buffer(*boot, o);

  ep::WorkloadOptions w;
  w.shape = {ranks, per_node, 4 * ranks};
  w.num_tokens = kTokens;
  w.hidden = kHidden;
  w.topk = 3;
  w.drop_fraction = 0.1;
  w.seed = 5;
  std::vector<ep::RankInputs> all;
  std::vector<ep::DispatchInputs> views;
  for (int r = 0; r < ranks; ++r)
    all.push_back(ep::make_rank_inputs(w, r));
  for (const auto& in : all)
    views.push_back({in.x, {}, in.topk_idx, in.topk_weights});
  const ep::RankInputs& mine = all[static_cast<size_t>(me)];
  std::vector<ep::ReferenceDispatch> want;
  for (int r = 0; r < ranks; ++r)
    want.push_back(ep::reference_dispatch(views, w.shape, r));
  const ep::ReferenceDispatch& wanted = want[static_cast<size_t>(me)];
  const int64_t recv = wanted.recv_src_idx.rows();

  const ep::Tensor x = upload(*device, mine.x), topk_idx = upload(*device, mine.topk_idx),
                   topk_weights = upload(*device, mine.topk_weights);
  // topk_idx and x as the caller's stream makes them, which the Buffer's stream must wait for.
  const ep::Tensor topk_idx_late = produce_on(caller, mine.topk_idx);
  const DispatchLayout layout =
      buffer.get_dispatch_layout(topk_idx_late, w.shape.num_experts, caller.record());
  const DispatchLayout host_layout = ep::compute_dispatch_layout(mine.topk_idx, w.shape);
  require_equal(*device, layout.is_token_in_rank, host_layout.is_token_in_rank, kTokens,
                "is_token_in_rank");
  require_equal(*device, layout.num_tokens_per_expert, host_layout.num_tokens_per_expert,
                w.shape.num_experts, "num_tokens_per_expert");

  // A call mixing host and device tensors is refused on this rank before anything is sent (every
  // rank makes the same mistake, so no peer waits), and the Buffer stays usable.
  require_mentions(error_of([&] {
                     buffer.dispatch({.x = mine.x,
                                      .num_tokens_per_rank = layout.num_tokens_per_rank,
                                      .is_token_in_rank = layout.is_token_in_rank,
                                      .num_tokens_per_expert = layout.num_tokens_per_expert,
                                      .topk_idx = topk_idx,
                                      .topk_weights = topk_weights});
                   }),
                   "num_tokens_per_rank is in device memory but x is in host memory");
  // So is a previous_event with host tensors: it orders device work.
  const std::string host_event = error_of([&] {
    buffer.dispatch({.x = mine.x,
                     .num_tokens_per_rank = host_layout.num_tokens_per_rank,
                     .is_token_in_rank = host_layout.is_token_in_rank,
                     .num_tokens_per_expert = host_layout.num_tokens_per_expert,
                     .topk_idx = mine.topk_idx,
                     .topk_weights = mine.topk_weights,
                     .previous_event = caller.record()});
  });
  require_mentions(host_event, "previous_event orders the Buffer's device stream");
  // A call is not capturable yet: after an event recorded inside the caller's capture it is
  // refused before anything is queued, the Buffer stays usable and the capture valid.
  caller.begin_capture("caller capture");
  const std::shared_ptr<gpu_side::device::DeviceEvent> in_graph = caller.record();
  (void)caller.end_capture("caller capture");
  require_mentions(error_of([&] {
                     buffer.dispatch({.x = x,
                                      .num_tokens_per_rank = layout.num_tokens_per_rank,
                                      .is_token_in_rank = layout.is_token_in_rank,
                                      .num_tokens_per_expert = layout.num_tokens_per_expert,
                                      .topk_idx = topk_idx,
                                      .topk_weights = topk_weights,
                                      .previous_event = in_graph});
                   }),
                   "dispatch: previous_event was recorded inside a graph capture");

  const ep::Tensor x_late = produce_on(caller, mine.x);
  DispatchResult d = buffer.dispatch({.x = x_late,
                                      .num_tokens_per_rank = layout.num_tokens_per_rank,
                                      .is_token_in_rank = layout.is_token_in_rank,
                                      .num_tokens_per_expert = layout.num_tokens_per_expert,
                                      .topk_idx = topk_idx,
                                      .topk_weights = topk_weights,
                                      .async_finish = true,
                                      .previous_event = caller.record()});
  require(d.handle.num_recv_tokens == recv, "test", "received {} rows, reference {}",
          d.handle.num_recv_tokens, recv);
  // The caller waits for the async call (ep.async_wait: its stream at the call's device point,
  // this thread never waiting, or the host): the CommStream's thread finishes the call
  // meanwhile, and the caller's stream reads its outputs complete without waiting for the
  // Buffer's stream.
  caller_waits_for(caller, d.event, "dispatch");
  require_equal(caller, d.recv_x, wanted.recv_x, recv, "recv_x");
  require_equal(caller, d.recv_topk_idx, wanted.recv_topk_idx, recv, "recv_topk_idx");
  require_equal(caller, d.recv_topk_weights, wanted.recv_topk_weights, recv, "recv_topk_weights");
  // An async cached dispatch whose event is never waited for: the next call (the combine) finds
  // its device outputs filled, as later work on a stream does.
  const DispatchResult cached =
      buffer.dispatch({.x = x, .handle = &d.handle, .async_finish = true});

  std::vector<ep::TensorRef> expert_out, weights;
  for (const auto& r : want) {
    expert_out.push_back(r.recv_x);
    weights.push_back(r.recv_topk_weights);
  }
  // Across full nodes the combine is hierarchical: each node's rows summed first (by_node).
  const ep::CombineOrder order = buffer.stats().internode == "hierarchical"
                                     ? ep::CombineOrder::by_node
                                     : ep::CombineOrder::by_rank;
  const ep::ReferenceCombine combined_want =
      ep::reference_combine(expert_out, want, weights, w.shape, me, kTokens, {}, {}, order);
  const CombineResult c = buffer.combine({.x = d.recv_x,
                                          .handle = &d.handle,
                                          .topk_weights = d.recv_topk_weights,
                                          .async_finish = true});
  require_equal(*device, cached.recv_x, wanted.recv_x, recv, "recv_x (cached)");
  caller_waits_for(caller, c.event, "combine");
  require_equal(caller, c.combined_x, combined_want.combined_x, kTokens, "combined_x");
  require_equal(caller, c.combined_topk_weights, combined_want.combined_topk_weights, kTokens,
                "combined_topk_weights");

  // One call, tensors in different places on different ranks: rank 0's in host memory, the
  // others' on their devices. Each rank's side follows its own tensors: rank 0 offers its landing
  // region for recv_x and a device rank's kernels cannot reach it (stored through the slots);
  // rank 0's combine may have the fabric send straight from its x, a device rank's never (no
  // weights, so x's rows are offered).
  const bool on_host = me == 0;
  auto same = [&](const ep::Tensor& got, const ep::Tensor& want, int64_t rows,
                  const std::string& what) {
    if (!on_host) return require_equal(caller, got, want, rows, what);
    require(got.device() == ep::Device::host, "test", "{} of a host call is not host memory", what);
    const size_t bytes =
        static_cast<size_t>(rows) * want.bytes() / static_cast<size_t>(want.rows());
    require(std::memcmp(got.raw(), want.raw(), bytes) == 0, "test", "{} differs (mixed)", what);
  };
  const DispatchResult m =
      on_host ? buffer.dispatch({.x = mine.x,
                                 .num_tokens_per_rank = host_layout.num_tokens_per_rank,
                                 .is_token_in_rank = host_layout.is_token_in_rank,
                                 .num_tokens_per_expert = host_layout.num_tokens_per_expert,
                                 .topk_idx = mine.topk_idx,
                                 .topk_weights = mine.topk_weights})
              : buffer.dispatch({.x = x,
                                 .num_tokens_per_rank = layout.num_tokens_per_rank,
                                 .is_token_in_rank = layout.is_token_in_rank,
                                 .num_tokens_per_expert = layout.num_tokens_per_expert,
                                 .topk_idx = topk_idx,
                                 .topk_weights = topk_weights});
  require(m.handle.num_recv_tokens == recv, "test", "mixed: received {} rows, reference {}",
          m.handle.num_recv_tokens, recv);
  same(m.recv_x, wanted.recv_x, recv, "recv_x (mixed)");
  same(m.recv_topk_idx, wanted.recv_topk_idx, recv, "recv_topk_idx (mixed)");
  // Without weights: every rank's own rows come back unweighted (the reference with none).
  const ep::ReferenceCombine plain_want =
      ep::reference_combine(expert_out, want, {}, w.shape, me, kTokens, {}, {}, order);
  const CombineResult mc = buffer.combine({.x = m.recv_x, .handle = &m.handle});
  same(mc.combined_x, plain_want.combined_x, kTokens, "combined_x (mixed)");

  // (A node daemon's shim is its own: its sessions report none.)
  const bool spans_nodes = per_node < ranks;
  // Full nodes of several ranks forward (hierarchical internode), device calls as host ones.
  if (spans_nodes && per_node > 1 && params::ep_internode.get() == "hierarchical")
    require(buffer.stats().internode == "hierarchical" && buffer.stats().rows_forwarded > 0, "test",
            "device calls crossed nodes {}, forwarding {} rows", buffer.stats().internode,
            buffer.stats().rows_forwarded);
  if (spans_nodes && params::proxy_mode.get() != "daemon")
    require(buffer.stats().reordered_completions.has_value(), "test",
            "the fabric path ran without the reorder shim");
  // Over the fabric the device's stream hands the writes its kernels filled to the proxies
  // (proxy/session/device_route.hpp); node peers have none.
  const uint64_t from_device = buffer.stats().writes_from_device;
  require(spans_nodes == (from_device > 0), "test",
          "{} writes went through the device's stream ({} ranks per node)", from_device, per_node);
  // Node peers' rows go into their device arenas (proxy/session/device_arenas.hpp); every device
  // here shares memory. (A rank's rows to itself go straight into its outputs.) Other nodes' rows
  // too where the fabric registers device memory (FI_HMEM) and the device offers NIC-readable
  // memory: what nic_device_memory says.
  const uint64_t to_device_arenas = buffer.stats().sends_to_device_arenas;
  require((per_node > 1 || nic_device_memory) == (to_device_arenas > 0), "test",
          "{} payloads went into node peers' device arenas ({} ranks per node)", to_device_arenas,
          per_node);
  const uint64_t from_device_memory = buffer.stats().chunks_from_device_memory;
  require(device_chunks == (from_device_memory > 0), "test",
          "{} chunks were written from device memory (expected {})", from_device_memory,
          device_chunks ? "some" : "none");
  caller.synchronize("test caller stream", kWait);
  buffer.destroy();
}

// Three times: with the default ep.eager_bytes (these rows travel with the notify records);
// with none (chunks through the slots, recv_x in the landing region where a host rank offers
// it); and with none in a Buffer for 4 tokens (many chunks per stream, each slot reused within
// a call, so a credit handed back before the device copied the slot out shows). Over
// `provider`; `nic_device_memory`: as run_device_buffer_rank says; `ranks` ranks.
inline void run_device_buffer(int per_node, const DeviceFactory& make_device,
                              const std::string& provider = "tcp", bool nic_device_memory = false,
                              int ranks = kRanks) {
  struct Run {
    bool eager;
    int sized_for;
  };
  for (const Run run : {Run{true, kTokens}, Run{false, kTokens}, Run{false, 4}}) {
    INFO("eager rows: " << run.eager << ", Buffer sized for " << run.sized_for << " tokens");
    if (!run.eager) params::ep_eager_bytes.set(0);
    run_buffer_ranks(
        ranks, per_node < ranks,
        [per_node, make_device, run, nic_device_memory](control::Bootstrap::Options o) {
          run_device_buffer_rank(per_node, std::move(o), make_device, run.sized_for,
                                 nic_device_memory);
        },
        provider);
    params::ep_eager_bytes.reset();
  }
}

}  // namespace proxyep::integrations::testing
