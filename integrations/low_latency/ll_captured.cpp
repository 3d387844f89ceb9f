// CapturedLowLatency (ll_captured.hpp).
#include "integrations/low_latency/ll_captured.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/device_table.hpp"
#include "integrations/low_latency/ll_args.hpp"
#include "integrations/low_latency/ll_tensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

namespace ep = proxyep::gpu_side::ep;
namespace device = proxyep::gpu_side::device;

namespace proxyep::integrations::low_latency {

namespace {

constexpr const char* kDispatch = "low_latency_dispatch (captured)";
constexpr const char* kCombine = "low_latency_combine (captured)";

std::chrono::milliseconds timeout() {
  return std::chrono::milliseconds(params::ep_timeout_ms.get());
}

uint64_t round_up(uint64_t bytes, uint64_t to) {
  return (bytes + to - 1) / to * to;
}

// The signal words of the step transport (between nodes), kind * ranks + peer: what the proxy
// counts for each peer on another node.
enum WordKind : uint32_t {
  kDispatchArrived = 0,   // its dispatch writes that landed (two a step)
  kDispatchReleased = 1,  // the steps in which it read my messages
  kCombineArrived = 2,    // its combine rows that landed (one write a step)
  kCombineReleased = 3,   // the steps in which it read my rows
  kWordKinds = 4,
};

// What a captured call cannot take, whatever the mode of the Buffer.
void refuse_host_parts(bool async, const std::shared_ptr<device::DeviceEvent>& event,
                       const char* phase) {
  require(!async, phase,
          "async_finish cannot be captured: the graph is the asynchrony (launch it where the "
          "call should run; or pass return_recv_hook and call the hook inside a capture)");
  require(event == nullptr || event->captured(), phase,
          "previous_event was recorded outside the capture: a graph cannot wait for it (record "
          "it on the capturing stream, inside the capture)");
}

// The Buffer's stream after the caller's point: joining the caller's capture (a previous_event
// recorded inside it), or ordered after that point inside its own. Right before the step is
// queued: a call refused earlier leaves the caller's capture as it was.
void join_caller(device::DeviceRuntime& device, const std::shared_ptr<device::DeviceEvent>& event) {
  if (event != nullptr) device.wait_event(event, timeout());
}

// The call's event: where its step ends inside the graph, for the caller's stream to join back.
// The host has nothing to wait for (a launch does the work).
CallEvent captured_end(device::DeviceRuntime& device) {
  return CallEvent([] {}, device.record());
}

// A captured call's hook (return_recv_hook): queues `receive` (the step's receive half) on the
// Buffer's stream, which must be capturing then (begun there, or joined to the caller's
// capture), and records where it ends for the capturing stream to join back (device_point()).
// A second call does nothing, as any hook's.
RecvHook captured_hook(std::shared_ptr<device::DeviceRuntime> device, std::function<void()> receive,
                       const char* phase) {
  struct State {
    std::mutex mutex;
    bool done = false;
    std::shared_ptr<device::DeviceEvent> end;
  };
  auto state = std::make_shared<State>();
  return RecvHook(
      [state, device = std::move(device), receive = std::move(receive), phase] {
        std::lock_guard lock(state->mutex);
        if (state->done) return;
        require(device->capturing(), phase,
                "the hook of a captured call queues its receive into the capture: call it while "
                "the Buffer's device stream is captured (or joined to the caller's capture)");
        receive();
        state->end = device->record();
        state->done = true;
      },
      [state] {
        std::lock_guard lock(state->mutex);
        return state->end;
      });
}

// A tensor the step writes (an output, a statistics tensor; checked by the call's argument
// checks), or null for none.
template <typename T>
T* written(const ep::TensorRef& t) {
  return t.defined() ? static_cast<T*>(const_cast<void*>(t.data)) : nullptr;
}

// Static outputs: device memory allocated outside the capture (a stream of the device that is
// not captured), zeroed, alive while the caller holds them.
ep::Tensor static_output(device::DeviceRuntime& setup, ep::DType dtype, int64_t rows,
                         int64_t cols) {
  const uint64_t bytes = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols < 0 ? 1 : cols) *
                         ep::dtype_size(dtype);
  std::shared_ptr<std::byte[]> memory = setup.allocate(std::max<uint64_t>(bytes, 16));
  setup.fill(memory.get(), 0, std::max<uint64_t>(bytes, 16));
  return ep::Tensor::over(std::move(memory), dtype, rows, cols, ep::Device::cuda);
}

}  // namespace

CapturedLowLatency::Layout CapturedLowLatency::layout_for(const LlShape& shape, int ranks,
                                                          int remotes) {
  ep::LlFormat widest;  // BF16 messages: the largest of every format
  widest.hidden = static_cast<uint32_t>(shape.hidden);
  widest.fp8 = false;
  const int32_t local = shape.experts / ranks;
  Layout l;
  l.slot_bytes = ll_node_slot_bytes(widest, shape.tokens, local);
  l.return_bytes = ll_node_return_slot_bytes(widest.hidden, shape.tokens, local);
  l.returns_at = static_cast<uint64_t>(ranks) * l.slot_bytes;
  l.counts_at = l.returns_at + static_cast<uint64_t>(ranks) * l.return_bytes;
  l.words_at = l.counts_at + round_up(4ull * static_cast<uint64_t>(ranks * local), 64);
  // arrived, released (dispatch); arrived, released (combine); the two epochs.
  l.bytes = l.words_at + 8ull * (4ull * static_cast<uint64_t>(ranks) + 2);
  const uint64_t slot = round_up(l.slot_bytes, 64), back = round_up(l.return_bytes, 64),
                 row = round_up(4ull * static_cast<uint64_t>(local), 64);
  l.recv_slot_at = 0;
  l.send_slot_at = slot;
  l.recv_return_at = 2 * slot;
  l.send_return_at = 2 * slot + back;
  l.recv_counts_at = 2 * slot + 2 * back;
  l.send_counts_at = l.recv_counts_at + row;
  l.remote_stride = l.send_counts_at + row;
  l.remote_bytes = static_cast<uint64_t>(remotes) * l.remote_stride;
  return l;
}

std::vector<int> CapturedLowLatency::remote_ranks() const {
  std::vector<int> ranks;
  for (int r = 0; r < session_.ranks(); ++r)
    if (!session_.layout().on_node(r)) ranks.push_back(r);
  return ranks;
}

uint64_t CapturedLowLatency::remote_base(int of, int at) const {
  const int P = session_.ranks_per_node(), first = at / P * P;  // at's node: its ranks from first
  const int index = of < first ? of : of - proxy::node_size(at, session_.ranks(), P);
  return static_cast<uint64_t>(index) * layout_.remote_stride;
}

gpu_side::Descriptor CapturedLowLatency::write_to(int to, uint64_t from_offset, uint64_t to_offset,
                                                  uint64_t bytes, uint32_t word) const {
  gpu_side::Descriptor d;
  d.op = bytes > 0 ? gpu_side::Op::write_imm : gpu_side::Op::signal;
  d.dst_rank = static_cast<uint32_t>(to);
  d.local_region = d.remote_region = link_->region;
  d.src_offset = from_offset;
  d.dst_offset = to_offset;
  d.length = bytes;
  d.imm = control::SignalWords::imm_for(word);
  return d;
}

std::vector<LlRemotePeer> CapturedLowLatency::remote_peers() const {
  if (!link_) return {};
  const int R = session_.ranks();
  std::vector<LlRemotePeer> peers(static_cast<size_t>(R));
  for (const int r : remote_ranks()) {
    std::byte* base = link_->memory + remote_base(r, session_.rank());
    const uint64_t* words = link_->words;
    peers[static_cast<size_t>(r)] = {
        .send_slot = base + layout_.send_slot_at,
        .send_counts = reinterpret_cast<int32_t*>(base + layout_.send_counts_at),
        .recv_slot = base + layout_.recv_slot_at,
        .recv_counts = reinterpret_cast<const int32_t*>(base + layout_.recv_counts_at),
        .arrived = words + kDispatchArrived * R + r,
        .released = words + kDispatchReleased * R + r};
  }
  return peers;
}

std::vector<LlRemoteReturn> CapturedLowLatency::remote_homes() const {
  if (!link_) return {};
  const int R = session_.ranks();
  std::vector<LlRemoteReturn> homes(static_cast<size_t>(R));
  for (const int r : remote_ranks()) {
    std::byte* base = link_->memory + remote_base(r, session_.rank());
    homes[static_cast<size_t>(r)] = {.send_slot = base + layout_.send_return_at,
                                     .recv_slot = base + layout_.recv_return_at,
                                     .arrived = link_->words + kCombineArrived * R + r,
                                     .released = link_->words + kCombineReleased * R + r};
  }
  return homes;
}

// Every write leaves this rank's part for the peer (remote_base(peer, me)) for this rank's part
// at the peer (remote_base(me, peer)); its immediate names the peer's word that counts it.
LlRemoteSends CapturedLowLatency::dispatch_sends() const {
  LlRemoteSends out;
  if (!link_) return out;
  const int R = session_.ranks(), me = session_.rank();
  const auto local = static_cast<uint64_t>(shape_->experts / R);
  std::vector<gpu_side::Descriptor> rows;
  for (const int r : remote_ranks()) {
    const uint64_t mine = remote_base(r, me), theirs = remote_base(me, r);
    out.sends.push_back(write_to(r, mine + layout_.send_slot_at, theirs + layout_.recv_slot_at, 0,
                                 kDispatchArrived * R + me));
    rows.push_back(write_to(r, mine + layout_.send_counts_at, theirs + layout_.recv_counts_at,
                            4 * local, kDispatchArrived * R + me));
    out.releases.push_back(write_to(r, 0, 0, 0, kDispatchReleased * R + me));
  }
  out.sends.insert(out.sends.end(), rows.begin(), rows.end());
  out.ring = link_->ring;
  return out;
}

LlRemoteSends CapturedLowLatency::combine_sends() const {
  LlRemoteSends out;
  if (!link_) return out;
  const int R = session_.ranks(), me = session_.rank();
  for (const int r : remote_ranks()) {
    out.sends.push_back(write_to(r, remote_base(r, me) + layout_.send_return_at,
                                 remote_base(me, r) + layout_.recv_return_at, 0,
                                 kCombineArrived * R + me));
    out.releases.push_back(write_to(r, 0, 0, 0, kCombineReleased * R + me));
  }
  out.ring = link_->ring;
  return out;
}

LlNodeMemory CapturedLowLatency::dispatch_memory(int rank) const {
  if (!session_.layout().on_node(rank)) return {};  // remote_peers()
  std::byte* base = memory_->peer(rank);
  auto* words = reinterpret_cast<uint64_t*>(base + layout_.words_at);
  const int R = session_.ranks();
  return {.slots = base,
          .counts = reinterpret_cast<int32_t*>(base + layout_.counts_at),
          .arrived = words,
          .released = words + R};
}

LlNodeReturnMemory CapturedLowLatency::return_memory(int rank) const {
  if (!session_.layout().on_node(rank)) return {};  // remote_homes()
  std::byte* base = memory_->peer(rank);
  auto* words = reinterpret_cast<uint64_t*>(base + layout_.words_at);
  const int R = session_.ranks();
  return {.slots = base + layout_.returns_at, .arrived = words + 2 * R, .released = words + 3 * R};
}

uint64_t* CapturedLowLatency::epoch(int which) const {
  auto* words = reinterpret_cast<uint64_t*>(memory_->local() + layout_.words_at);
  return words + 4 * session_.ranks() + which;
}

void CapturedLowLatency::open_memory(const std::shared_ptr<device::DeviceRuntime>& device,
                                     const LlShape& shape, const char* phase) {
  const int R = session_.ranks();
  require(!shrink_, phase,
          "a Buffer with enable_shrink cannot capture low-latency calls: a masked rank's steps "
          "would never be signalled");
  if (shape_) {
    require(*shape_ == shape, phase,
            "every captured call of a Buffer uses the sizes of its first ({}); this one has {}",
            describe(*shape_), describe(shape));
    return;
  }
  // Every rank's sizes, before the collective allocation (whose sizes must agree).
  const int32_t mine[3] = {shape.tokens, shape.hidden, shape.experts};
  const auto all =
      bootstrap_.allgather(std::span(reinterpret_cast<const uint8_t*>(mine), sizeof mine),
                           fmt::format("{}: the sizes of the step memory", phase));
  std::string differ;
  for (int r = 0; r < R; ++r) {
    int32_t theirs[3] = {0, 0, 0};
    std::memcpy(theirs, all[static_cast<size_t>(r)].data(),
                std::min(sizeof theirs, all[static_cast<size_t>(r)].size()));
    if (std::memcmp(theirs, mine, sizeof mine) != 0)
      differ +=
          fmt::format("; rank {}: {}", r,
                      describe({.tokens = theirs[0], .hidden = theirs[1], .experts = theirs[2]}));
  }
  require(differ.empty(), phase, "every rank must capture the same sizes: rank {} uses {}{}",
          session_.rank(), describe(shape), differ);
  const auto remotes = static_cast<int>(remote_ranks().size());
  const Layout layout = layout_for(shape, R, remotes);
  // The shared memory and its zeroing are no part of the graph (the thread's capture relaxed).
  const device::SetupStream setup = device::setup_stream(device);
  auto memory = std::make_unique<proxy::DeviceArenas>(bootstrap_, device, layout.bytes,
                                                      session_.ranks_per_node(), timeout(), phase);
  // Zeroed before any rank may step (a peer's first signal must not be wiped by this fill);
  // then every rank says whether it reaches every rank's memory, so that all fail alike.
  std::string unreachable;
  for (int r = 0; r < R; ++r)
    if (session_.layout().on_node(r) && memory->peer(r) == nullptr)
      unreachable += fmt::format(" {}", r);
  if (unreachable.empty()) {
    setup->fill(memory->local(), 0, layout.bytes);
    setup->synchronize(phase, timeout());
  }
  const uint8_t reached = unreachable.empty() ? 1 : 0;
  const auto ready = bootstrap_.allgather(std::span(&reached, 1),
                                          fmt::format("{}: the step memory zeroed", phase));
  std::string cannot;
  for (int r = 0; r < R; ++r)
    if (ready[static_cast<size_t>(r)].empty() || ready[static_cast<size_t>(r)][0] != 1)
      cannot += fmt::format(" {}", r);
  require(cannot.empty(), phase,
          "ranks{} cannot reach every rank's step memory (this rank misses ranks{}): a device "
          "that shares no memory, or GPUs without peer access",
          cannot, unreachable.empty() ? " none" : unreachable);
  // The ranks on other nodes: the step transport (collective too, every rank alike).
  if (remotes > 0)
    link_ = session_.open_step_link(bootstrap_, device, layout.remote_bytes,
                                    kWordKinds * static_cast<uint32_t>(R), phase);
  memory_ = std::move(memory);
  layout_ = layout;
  shape_ = shape;
}

namespace {

// A captured dispatch's outputs: static tensors, as a graph's must be (its replays write them).
struct DispatchOutputs {
  ep::Tensor recv_x, scales, recv_count, src_info, range;
};

DispatchOutputs dispatch_outputs(const std::shared_ptr<device::DeviceRuntime>& device,
                                 const DispatchInput& in, int ranks,
                                 std::chrono::milliseconds timeout) {
  const int32_t local = in.shape.experts / ranks;
  const int64_t rows = static_cast<int64_t>(ranks) * in.shape.tokens;
  const ep::LlFormat& f = in.format;
  const device::SetupStream setup = device::setup_stream(device);
  DispatchOutputs out;
  out.recv_x = static_output(*setup, f.fp8 ? ep::DType::fp8_e4m3 : ep::DType::bf16, local * rows,
                             in.shape.hidden);
  if (f.fp8)
    out.scales = static_output(*setup, f.ue8m0 ? ep::DType::i32 : ep::DType::f32,
                               local * static_cast<int64_t>(f.scale_words()), rows);
  out.recv_count = static_output(*setup, ep::DType::i32, local, -1);
  out.src_info = static_output(*setup, ep::DType::i32, local, rows);
  out.range = static_output(*setup, ep::DType::i64, local, ranks);
  setup->synchronize(kDispatch, timeout);
  return out;
}

}  // namespace

LowLatencyDispatchResult CapturedLowLatency::dispatch(
    const std::shared_ptr<device::DeviceRuntime>& device, const LowLatencyDispatchArgs& a) {
  // The setup (step memory, static outputs) runs before the Buffer's stream joins a caller's
  // capture: a capture in CUDA's global mode (torch.cuda.graph's) refuses it from this thread
  // unless relaxed.
  const std::shared_ptr<void> relaxed = device->relax_capture();
  const int R = session_.ranks();
  const DispatchInput in = check_dispatch_args(a, R, true);
  refuse_host_parts(a.async_finish, a.previous_event, kDispatch);
  open_memory(device, in.shape, kDispatch);
  const int32_t local = in.shape.experts / R;
  auto captured = std::make_shared<CapturedDispatch>();
  const ep::LlFormat& f = in.format;
  DispatchOutputs outputs = dispatch_outputs(device, in, R, timeout());
  ep::Tensor &recv_x = outputs.recv_x, &scales = outputs.scales;
  ep::Tensor &recv_count = outputs.recv_count, &src_info = outputs.src_info;
  ep::Tensor& range = outputs.range;

  LlNodeDispatchPlan plan{.rank = session_.rank(),
                          .ranks = R,
                          .local_experts = local,
                          .slot_bytes = layout_.slot_bytes,
                          .memory = {},
                          .epoch = epoch(0),
                          .timeout = timeout(),
                          .format = f,
                          .max_tokens = in.shape.tokens,
                          .num_tokens = in.tokens,
                          .topk = static_cast<int>(in.topk),
                          .x = static_cast<const uint16_t*>(a.x.data),
                          .topk_idx = static_cast<const int64_t*>(a.topk_idx.data),
                          .recv_x = recv_x.raw(),
                          .recv_x_scales = f.fp8 ? scales.data<uint32_t>() : nullptr,
                          .src_info = src_info.data<int32_t>(),
                          .recv_count = recv_count.data<int32_t>(),
                          .layout_range = range.data<int64_t>(),
                          .recv_stats = written<int32_t>(a.cumulative_local_expert_recv_stats),
                          .wait_stats = written<int64_t>(a.dispatch_wait_recv_cost_stats)};
  for (int r = 0; r < R; ++r)
    plan.memory.push_back(dispatch_memory(r));
  plan.remote = remote_peers();
  plan.remote_sends = dispatch_sends();
  captured->step = std::make_unique<LlNodeDispatch>(device, std::move(plan), kDispatch);
  captured->topk_idx = a.topk_idx;
  join_caller(*device, a.previous_event);
  if (a.return_recv_hook) {
    captured->step->queue_send(kDispatch);
  } else {
    captured->step->queue(kDispatch);
    captured->received = true;
  }
  captured->outputs = {recv_x, scales, recv_count, src_info, range};
  dispatches_.push_back(captured);

  LowLatencyDispatchResult out;
  out.recv_x = recv_x;
  out.recv_x_scales = scales;
  out.recv_count = recv_count;
  out.handle.src_info = src_info;
  out.handle.layout_range = range;
  out.handle.num_max_dispatch_tokens_per_rank = in.shape.tokens;
  out.handle.hidden = in.shape.hidden;
  out.handle.num_experts = in.shape.experts;
  out.handle.device = ep::Device::cuda;
  out.handle.captured = captured;
  out.event = captured_end(*device);
  if (a.return_recv_hook) {
    out.hook = captured_hook(
        device,
        [alive = std::weak_ptr<void>(alive_), d = captured.get()] {
          require(!alive.expired(), kDispatch, "the hook outlived its Buffer");
          d->step->queue_receive(kDispatch);
          d->received = true;
        },
        kDispatch);
  }
  return out;
}

std::pair<int64_t, int64_t> CapturedLowLatency::combine_buffer_shape(
    const LowLatencyHandle& handle) const {
  require(std::find(dispatches_.begin(), dispatches_.end(), handle.captured) != dispatches_.end(),
          "get_next_low_latency_combine_buffer",
          "the handle was not made by this Buffer's low_latency_dispatch");
  const LlNodeDispatchPlan& p = handle.captured->step->plan();
  return {static_cast<int64_t>(p.local_experts) * p.ranks * p.max_tokens,
          static_cast<int64_t>(p.format.hidden)};
}

LowLatencyCombineResult CapturedLowLatency::combine(
    const std::shared_ptr<device::DeviceRuntime>& device, const LowLatencyCombineArgs& a,
    const ep::TensorRef& combine_buffer) {
  const std::shared_ptr<void> relaxed = device->relax_capture();  // as the dispatch's
  require(a.handle != nullptr && a.handle->captured != nullptr, kCombine,
          "the handle came from a dispatch that was not captured: a captured combine needs a "
          "captured dispatch's handle");
  CapturedDispatch& d = *a.handle->captured;
  require(
      std::find(dispatches_.begin(), dispatches_.end(), a.handle->captured) != dispatches_.end(),
      kCombine, "the handle was not made by this Buffer's low_latency_dispatch");
  refuse_host_parts(a.async_finish, a.previous_event, kCombine);
  require(d.received, kCombine,
          "the dispatch's receive was never queued: call its hook (inside a capture) before "
          "capturing its combine");
  require(!a.use_logfmt, kCombine,
          "use_logfmt is not supported: ProxyEP combines in BF16 (pass use_logfmt=False)");
  require(d.combine == nullptr, kCombine,
          "this dispatch's combine was captured already: capture one combine per dispatch");
  const LlNodeDispatchPlan& p = d.step->plan();
  const int R = p.ranks;
  const int64_t rows = static_cast<int64_t>(p.local_experts) * R * p.max_tokens;
  const auto H = static_cast<int64_t>(p.format.hidden);
  // zero_copy: the expert outputs are in the combine buffer (get_next_low_latency_combine_buffer),
  // where the caller writes them before each launch.
  require(!a.zero_copy || combine_buffer.defined(), kCombine,
          "zero_copy: no combine buffer yet (call get_next_low_latency_combine_buffer first)");
  const ep::TensorRef x = a.zero_copy ? combine_buffer : a.x;
  check_tensor(x, ep::DType::bf16, rows, H, true, kCombine,
               a.zero_copy ? "the combine buffer" : "x", true);
  check_tensor(a.topk_idx, ep::DType::i64, p.num_tokens, p.topk, true, kCombine, "topk_idx", true);
  if (a.combine_wait_recv_cost_stats.defined())
    check_tensor(a.combine_wait_recv_cost_stats, ep::DType::i64, R, -1, true, kCombine,
                 "combine_wait_recv_cost_stats", true);
  require(a.topk_idx.data == d.topk_idx.data && a.topk_idx.row_stride == d.topk_idx.row_stride,
          kCombine,
          "topk_idx must be the tensor the captured dispatch routed (the graph reads its routing, "
          "not this tensor's values)");
  check_tensor(a.topk_weights, ep::DType::f32, p.num_tokens, p.topk, true, kCombine, "topk_weights",
               true);
  ep::Tensor combined;
  uint16_t* out = nullptr;
  if (a.out.defined()) {
    check_tensor(a.out, ep::DType::bf16, p.num_tokens, H, true, kCombine, "out", true);
    out = written<uint16_t>(a.out);
  } else {
    const device::SetupStream setup = device::setup_stream(device);
    combined = static_output(*setup, ep::DType::bf16, p.num_tokens, H);
    setup->synchronize(kCombine, timeout());
    out = combined.data<uint16_t>();
  }
  LlNodeCombinePlan plan{.slot_bytes = layout_.return_bytes,
                         .memory = {},
                         .epoch = epoch(1),
                         .x = static_cast<const uint16_t*>(x.data),
                         .topk_weights = static_cast<const float*>(a.topk_weights.data),
                         .out = out,
                         .wait_stats = written<int64_t>(a.combine_wait_recv_cost_stats)};
  for (int r = 0; r < R; ++r)
    plan.memory.push_back(return_memory(r));
  plan.remote = remote_homes();
  plan.remote_sends = combine_sends();
  auto step = std::make_unique<LlNodeCombine>(device, *d.step, std::move(plan), kCombine);
  join_caller(*device, a.previous_event);
  if (a.return_recv_hook)
    step->queue_send(kCombine);
  else
    step->queue(kCombine);
  LlNodeCombine* queued = step.get();
  d.combine = std::move(step);  // only once queued: a combine that failed may be captured again
  d.combined = combined;
  LowLatencyCombineResult result;
  result.combined_x = combined;
  result.event = captured_end(*device);
  if (a.return_recv_hook)  // the combine step lives as long as its dispatch, kept by the Buffer
    result.hook = captured_hook(
        device,
        [alive = std::weak_ptr<void>(alive_), queued] {
          require(!alive.expired(), kCombine, "the hook outlived its Buffer");
          queued->queue_receive(kCombine);
        },
        kCombine);
  return result;
}

}  // namespace proxyep::integrations::low_latency
