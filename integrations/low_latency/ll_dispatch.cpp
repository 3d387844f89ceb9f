// low_latency_dispatch: checks, routing, the FP8 cast, the send phase and the receive phase
// (low_latency_mode.hpp).
#include "common/error.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "integrations/low_latency/ll_args.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"

#include <algorithm>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

namespace {

constexpr const char* kPhase = "low_latency_dispatch";

// What the caller gets back: the outputs, and the handle its combine passes.
LowLatencyDispatchResult dispatch_result(const std::shared_ptr<CallState>& state, bool on_device) {
  const CallState& st = *state;
  LowLatencyDispatchResult out;
  out.recv_x = st.recv_x;
  out.recv_x_scales = st.recv_x_scales;
  out.recv_count = st.recv_count;
  out.handle.src_info = st.src_info;
  out.handle.layout_range = st.layout_range;
  out.handle.num_max_dispatch_tokens_per_rank = st.shape.tokens;
  out.handle.hidden = st.shape.hidden;
  out.handle.num_experts = st.shape.experts;
  out.handle.dispatched = state;
  if (on_device) out.handle.device = ep::Device::cuda;
  return out;
}

}  // namespace

std::shared_ptr<CallState> LowLatencyMode::dispatch_state(const LowLatencyDispatchArgs& a,
                                                          const DispatchInput& in,
                                                          const LlDeviceCall* device) {
  auto state = std::make_shared<CallState>();
  CallState& st = *state;
  st.buffer_id = buffer_id_;
  st.kind = LlKind::dispatch;
  st.shape = in.shape;
  st.format = in.format;
  st.flags = record_flags(in.format);
  st.ranks = session_.ranks();
  st.num_tokens = static_cast<int>(in.tokens);
  st.topk = static_cast<int>(in.topk);
  st.recv_stats = a.cumulative_local_expert_recv_stats;
  st.wait_stats = a.dispatch_wait_recv_cost_stats;
  st.backend = device != nullptr ? &device->backend : &backend_;
  if (device != nullptr)
    route_on_device(st, a.topk_idx);
  else
    route(st, a.topk_idx);
  return state;
}

void LowLatencyMode::make_dispatch_outputs(CallState& st, bool on_device) {
  const LlShape& shape = st.shape;
  const ep::LlFormat& format = st.format;
  const int R = st.ranks, local = shape.experts / R;
  const int64_t rows = static_cast<int64_t>(R) * shape.tokens;  // per local expert
  // A device call's outputs are fresh (stream-ordered allocations); the host's come from a pool.
  Outputs& pool = outputs_[dispatches_++ % 2];
  RowBackend& backend = *st.backend;
  auto make = [&](ep::Tensor& pooled, ep::DType dtype, int64_t n, int64_t cols) {
    if (!on_device) return output(pooled, dtype, n, cols);
    return cols < 0 ? backend.allocate(dtype, n) : backend.allocate(dtype, n, cols);
  };
  st.recv_x = make(pool.recv_x, format.fp8 ? ep::DType::fp8_e4m3 : ep::DType::bf16, local * rows,
                   shape.hidden);
  if (format.fp8)
    st.recv_x_scales = make(pool.recv_x_scales, format.ue8m0 ? ep::DType::i32 : ep::DType::f32,
                            local * static_cast<int64_t>(format.scale_words()), rows);
  st.recv_count = make(pool.recv_count, ep::DType::i32, local, -1);
  st.src_info = make(pool.src_info, ep::DType::i32, local, rows);
  st.layout_range = make(pool.layout_range, ep::DType::i64, local, R);
}

LowLatencyDispatchResult LowLatencyMode::dispatch(const LowLatencyDispatchArgs& a,
                                                  const LlDeviceCall* device) {
  calls_.check_usable(kPhase);
  const int R = session_.ranks();
  const DispatchInput in = check_dispatch_args(a, R, device != nullptr);
  const int local = in.shape.experts / R;
  check_slot_fits(in.shape, kPhase);
  calls_.check_can_begin(CallKind::deferred, kPhase);
  // Routed before the agreement: a device call's routing is where its bad values are found.
  std::shared_ptr<CallState> state = dispatch_state(a, in, device);
  if (!agreed_ || !(*agreed_ == in.shape)) agree(in.shape, kPhase);
  // In the background the cast reads a copy: the caller may reuse x as soon as the call returns.
  const bool background = a.return_recv_hook || a.async_finish;
  ep::TensorRef x = a.x;
  ep::Tensor x_device_copy;
  if (background && device != nullptr) {
    // On the device, done before the call returns: the caller's stream may write x next.
    RowBackend& backend = *state->backend;
    x_device_copy = backend.allocate(ep::DType::bf16, in.tokens, in.shape.hidden);
    backend.copy_rows(x_device_copy.raw(), static_cast<const std::byte*>(a.x.data), in.tokens,
                      2ull * in.shape.hidden);
    backend.complete(kPhase);
    x = x_device_copy;
  } else if (background) {
    x_copy_.assign(a.x.as<uint16_t>(), a.x.as<uint16_t>() + a.x.numel());
    x = ep::TensorRef::matrix(x_copy_.data(), ep::DType::bf16, in.tokens, in.shape.hidden);
  }
  make_dispatch_outputs(*state, device != nullptr);

  auto send = [this, state, x, x_device_copy, local] {
    (void)x_device_copy;  // holds the memory x points into
    CallState& st = *state;
    const uint64_t message = st.format.message_bytes();
    send_phase(st,
               {.fill =
                    [&](std::span<const int> destinations) {
                      if (st.routing) {
                        pack_routed(st, x, destinations);
                        return;
                      }
                      // Each destination's messages in its eager slot, in order_.
                      std::vector<ep::LlPackItem> items;
                      for (int d : destinations) {
                        std::byte* slot = session_.channel(d).eager_buffer(st.call);
                        const std::vector<int32_t>& tokens_to = order_[d];
                        for (size_t i = 0; i < tokens_to.size(); ++i)
                          items.push_back({.message = slot + i * message, .token = tokens_to[i]});
                      }
                      st.backend->ll_pack(st.format, x, items);
                    },
                .describe =
                    [&](int d, std::vector<int32_t>& counts) {
                      counts.assign(expert_counts_.begin() + d * local,
                                    expert_counts_.begin() + (d + 1) * local);
                      return static_cast<uint64_t>(st.sent_to[d]) * message;
                    }},
               kPhase);
  };

  LowLatencyDispatchResult out = dispatch_result(state, device != nullptr);
  launch(state, send, a.return_recv_hook, a.async_finish, out.hook, out.event);
  return out;
}

// Messages to rank d are grouped by its local expert, tokens ascending within an expert; a
// (token, k)'s message index there is what combine finds its row by. The counts and each
// selection's position within its expert are gpu_side/ep/ll_route.hpp's rule, the one the
// device computes the same routing by.
void LowLatencyMode::route(CallState& st, const ep::TensorRef& topk_idx) {
  const int R = st.ranks, local = st.shape.experts / R, K = st.topk;
  const auto selections = static_cast<size_t>(st.num_tokens) * static_cast<size_t>(K);
  st.topk_idx.resize(selections);
  for (int t = 0; t < st.num_tokens; ++t)
    for (int k = 0; k < K; ++k)
      st.topk_idx[static_cast<size_t>(t) * K + k] = topk_idx.at<int64_t>(t, k);
  expert_counts_.assign(static_cast<size_t>(R) * static_cast<size_t>(local), 0);
  std::vector<int32_t> positions(selections);
  int32_t invalid = 0;  // none: check_dispatch_args refused values outside [-1, experts)
  ep::ll_route_on_host({.topk_idx = st.topk_idx.data(),
                        .num_tokens = st.num_tokens,
                        .topk = K,
                        .num_experts = st.shape.experts,
                        .counts = expert_counts_.data(),
                        .positions = positions.data(),
                        .invalid = &invalid});
  const std::vector<int32_t> start = count_sends(st);
  order_.resize(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d)
    order_[d].resize(static_cast<size_t>(st.sent_to[d]));
  st.dest_of.assign(selections, -1);
  st.slot_of.assign(selections, -1);
  for (size_t i = 0; i < selections; ++i) {
    const int64_t e = st.topk_idx[i];
    if (e < 0) continue;
    const int d = static_cast<int>(e / local);
    const int32_t slot = start[static_cast<size_t>(e)] + positions[i];
    st.dest_of[i] = d;
    st.slot_of[i] = slot;
    order_[d][static_cast<size_t>(slot)] = static_cast<int32_t>(i / static_cast<size_t>(K));
  }
}

void LowLatencyMode::route_on_device(CallState& st, const ep::TensorRef& topk_idx) {
  RowBackend& backend = *st.backend;
  const int32_t experts = st.shape.experts;
  st.routing = backend.ll_route(topk_idx, experts);
  // The records' counts: the only thing the host reads of the routing.
  expert_counts_.resize(static_cast<size_t>(experts));
  int32_t invalid = 0;
  backend.copy_rows(reinterpret_cast<std::byte*>(expert_counts_.data()), st.routing->counts.raw(),
                    1, 4ull * static_cast<uint64_t>(experts));
  backend.copy_rows(reinterpret_cast<std::byte*>(&invalid), st.routing->invalid.raw(), 1, 4);
  backend.complete(kPhase);
  require(invalid == 0, kPhase,
          "{} of topk_idx's {} values are neither -1 nor an expert id in [0, {}) (counted on the "
          "device, where it lives)",
          invalid, st.routing->topk_idx.numel(), experts);
  count_sends(st);
}

std::vector<int32_t> LowLatencyMode::count_sends(CallState& st) {
  const int R = st.ranks, local = st.shape.experts / R;
  // Experts are laid out by rank; a rank's messages are grouped by its local expert.
  std::vector<int32_t> start(expert_counts_.size());
  st.sent_to.assign(static_cast<size_t>(R), 0);
  for (int d = 0; d < R; ++d) {
    int32_t at = 0;
    for (int e = 0; e < local; ++e) {
      start[static_cast<size_t>(d) * local + e] = at;
      at += expert_counts_[static_cast<size_t>(d) * local + e];
    }
    st.sent_to[d] = at;
  }
  return start;
}

void LowLatencyMode::pack_routed(const CallState& st, const ep::TensorRef& x,
                                 std::span<const int> destinations) {
  std::vector<std::byte*> slots(static_cast<size_t>(st.ranks), nullptr);
  for (int d : destinations)
    slots[static_cast<size_t>(d)] = session_.channel(d).eager_buffer(st.call);
  st.backend->ll_pack_routed(st.format, x, *st.routing, st.shape.experts / st.ranks, slots);
}

void LowLatencyMode::receive_dispatch(CallState& st) {
  const int R = st.ranks, local = st.shape.experts / R;
  std::vector<int64_t> waited;
  const std::vector<LlRecord> records = receive_all(st, waited, kPhase);
  const uint64_t message = st.format.message_bytes();
  for (int s = 0; s < R; ++s) {
    const LlRecord& r = records[s];
    require(static_cast<int>(r.counts.size()) == local, kPhase,
            "rank {} announced {} expert counts, this rank has {} experts", s, r.counts.size(),
            local);
    uint64_t messages = 0;
    for (int32_t c : r.counts) {
      require(c >= 0 && c <= st.shape.tokens, kPhase,
              "rank {} announced {} messages for one expert (at most {} fit)", s, c,
              st.shape.tokens);
      messages += static_cast<uint64_t>(c);
    }
    require(messages * message == r.eager_bytes, kPhase,
            "rank {} sent {} bytes for {} messages of {} bytes", s, r.eager_bytes, messages,
            message);
  }
  const int64_t rows = static_cast<int64_t>(R) * st.shape.tokens;
  const uint32_t scale_words = st.format.scale_words();
  // The records' counts place every message (gpu_side/ep/ll_counted.hpp): expert e's rows are
  // its sources' messages in rank order, each source's slot grouped by expert.
  std::vector<int32_t> counts(static_cast<size_t>(R) * local);  // source-major
  std::vector<const std::byte*> from(static_cast<size_t>(R), nullptr);
  for (int s = 0; s < R; ++s) {
    std::copy(records[s].counts.begin(), records[s].counts.end(),
              counts.begin() + static_cast<ptrdiff_t>(s) * local);
    if (records[s].eager_bytes > 0) from[s] = session_.channel(s).eager(st.call);
  }
  std::vector<ep::LlExpertSink> sinks(static_cast<size_t>(local));
  for (int e = 0; e < local; ++e) {
    ep::LlExpertSink& sink = sinks[static_cast<size_t>(e)];
    sink.x = st.recv_x.raw() + static_cast<uint64_t>(e) * rows * st.format.payload_bytes();
    if (scale_words > 0)
      sink.scales =
          st.recv_x_scales.data<uint32_t>() + static_cast<uint64_t>(e) * scale_words * rows;
    sink.scale_stride = rows;
    sink.src_info = st.src_info.data<int32_t>() + static_cast<uint64_t>(e) * rows;
  }
  RowBackend& backend = *st.backend;
  backend.ll_unpack_counted(st.format, counts, from, sinks, rows, st.recv_count.data<int32_t>(),
                            st.layout_range.data<int64_t>());
  // The same rule on the host, for what the host reads of the layout: combine's ranges, the
  // statistics.
  const ep::LlUnpackCountedParams placed{
      .counts = counts.data(), .ranks = R, .local_experts = local, .rows_per_expert = rows};
  std::vector<int64_t>& ranges = st.ranges;
  ranges.resize(static_cast<size_t>(local) * R);
  std::vector<int32_t> received(static_cast<size_t>(local));
  for (int e = 0; e < local; ++e) {
    for (int s = 0; s < R; ++s)
      ranges[static_cast<size_t>(e) * R + s] =
          ep::ll_counted_range(ep::ll_counted_place(placed, e, s));
    received[static_cast<size_t>(e)] = ep::ll_counted_rows(placed, e);
  }
  if (st.recv_stats.defined()) backend.add(st.recv_stats, std::span<const int32_t>(received));
  if (st.wait_stats.defined()) backend.add(st.wait_stats, std::span<const int64_t>(waited));
}

}  // namespace proxyep::integrations::low_latency
