// low_latency_combine: checks, the send phase (each received row back to its home rank, in the
// order it arrived) and the receive phase (the weighted reduce) (low_latency_mode.hpp).
#include "common/error.hpp"
#include "integrations/low_latency/ll_args.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"

#include <cstring>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

namespace {

constexpr const char* kPhase = "low_latency_combine";

// Rows of x that go back to one home rank: `bytes` from `from`, to byte `at` of its slot.
struct SendRun {
  const std::byte* from;
  uint64_t bytes;
  uint64_t at;
};

// Rows of x by home rank, each home's local experts in order: the order in which home packed
// its messages (ll_dispatch.cpp).
struct HomeRuns {
  std::vector<std::vector<SendRun>> runs;  // by home
  std::vector<uint64_t> bytes_to;          // by home: its slot's bytes
};

HomeRuns home_runs(const CallState& d, const std::byte* x) {
  const int R = d.ranks, local = d.shape.experts / R;
  const uint64_t row_bytes = 2 * static_cast<uint64_t>(d.shape.hidden);
  HomeRuns out{.runs = std::vector<std::vector<SendRun>>(static_cast<size_t>(R)),
               .bytes_to = std::vector<uint64_t>(static_cast<size_t>(R), 0)};
  for (int home = 0; home < R; ++home)
    for (int e = 0; e < local; ++e) {
      const int64_t range = d.ranges[static_cast<size_t>(e) * R + home];
      const int64_t begin = range >> 32, count = range & 0xffffffff;
      if (count == 0) continue;
      const int64_t first = static_cast<int64_t>(e) * R * d.shape.tokens + begin;
      const uint64_t bytes = static_cast<uint64_t>(count) * row_bytes;
      out.runs[home].push_back(
          {x + static_cast<uint64_t>(first) * row_bytes, bytes, out.bytes_to[home]});
      out.bytes_to[home] += bytes;
    }
  return out;
}

// A device call in the background sends from a copy, made on the device before the call returns:
// the caller's stream may write x (or the combine buffer) next, as DeepEP's send kernel has read
// it by then. Returns the copy, which `sends` now point into (one run per home).
ep::Tensor copy_aside(RowBackend& backend, HomeRuns& sends, int hidden) {
  const uint64_t row_bytes = 2 * static_cast<uint64_t>(hidden);
  uint64_t total = 0;
  for (uint64_t bytes : sends.bytes_to)
    total += bytes;
  ep::Tensor copy =
      backend.allocate(ep::DType::bf16, static_cast<int64_t>(total / row_bytes), hidden);
  std::vector<ep::CopyRun> copies;
  std::byte* to = copy.raw();
  for (size_t home = 0; home < sends.runs.size(); ++home) {
    for (const SendRun& run : sends.runs[home])
      copies.push_back({.to = to + run.at, .from = run.from, .bytes = run.bytes});
    if (sends.bytes_to[home] > 0) sends.runs[home] = {{to, sends.bytes_to[home], 0}};
    to += sends.bytes_to[home];
  }
  backend.copy_runs(copies);
  backend.complete(kPhase);
  return copy;
}

}  // namespace

std::shared_ptr<CallState> LowLatencyMode::combine_state(const LowLatencyCombineArgs& a,
                                                         const LlDeviceCall* device) {
  const CallState& d = *a.handle->dispatched;
  const int T = d.num_tokens, K = d.topk, H = d.shape.hidden;
  auto state = std::make_shared<CallState>();
  CallState& st = *state;
  st.buffer_id = buffer_id_;
  st.kind = LlKind::combine;
  st.shape = d.shape;
  st.format = ep::LlFormat{.hidden = static_cast<uint32_t>(H), .fp8 = false};
  st.ranks = d.ranks;
  st.num_tokens = T;
  st.topk = K;
  st.dispatched = a.handle->dispatched;
  RowBackend& backend = *(st.backend = device != nullptr ? &device->backend : &backend_);
  if (device != nullptr) {
    // The check the host path makes entry by entry, made where both routings live.
    const int64_t selections = static_cast<int64_t>(T) * K;
    const int64_t differing = backend.count_mismatches(
        a.topk_idx.as<int64_t>(), d.routing->topk_idx.data<int64_t>(), selections, kPhase);
    require(differing == 0, kPhase,
            "topk_idx differs from the one this handle's dispatch routed by in {} of its {} "
            "entries (compared on the device)",
            differing, selections);
  }
  st.wait_stats = a.combine_wait_recv_cost_stats;
  st.weights = backend.allocate(ep::DType::f32, T, K);
  if (device != nullptr) {
    backend.copy_rows(st.weights.raw(), static_cast<const std::byte*>(a.topk_weights.data), T,
                      4ull * K);
  } else {
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        st.weights.data<float>()[static_cast<size_t>(t) * K + k] = a.topk_weights.at<float>(t, k);
  }
  if (a.out.defined()) {
    st.out = const_cast<uint16_t*>(a.out.as<uint16_t>());
  } else {
    // A device call's output is fresh (a stream-ordered allocation); the host's from a pool.
    st.combined = device != nullptr
                      ? backend.allocate(ep::DType::bf16, T, H)
                      : output(outputs_[combines_++ % 2].combined, ep::DType::bf16, T, H);
    st.out = st.combined.data<uint16_t>();
  }
  return state;
}

LowLatencyCombineResult LowLatencyMode::combine(const LowLatencyCombineArgs& a,
                                                const LlDeviceCall* device) {
  calls_.check_usable(kPhase);
  const std::byte* x = check_combine_args(
      a, buffer_id_, device != nullptr ? device->combine_buffer : combine_buffer_.ref(),
      device != nullptr);
  calls_.check_can_begin(CallKind::deferred, kPhase);
  std::shared_ptr<CallState> state = combine_state(a, device);
  HomeRuns sends = home_runs(*state->dispatched, x);
  // A host call in the background reads x until the hook returns or the event is set.
  ep::Tensor x_copy;
  if (device != nullptr && (a.return_recv_hook || a.async_finish))
    x_copy = copy_aside(*state->backend, sends, state->shape.hidden);

  auto send = [this, state, sends = std::move(sends), x_copy] {
    (void)x_copy;  // holds the memory the runs point into
    const CallState& st = *state;
    send_phase(
        st,
        {.fill =
             [&](std::span<const int> homes) {
               // Every run to these homes, one batch (a device copies them in one kernel).
               std::vector<ep::CopyRun> copies;
               for (int home : homes) {
                 std::byte* slot = session_.channel(home).eager_buffer(st.call);
                 for (const SendRun& run : sends.runs[home])
                   copies.push_back({.to = slot + run.at, .from = run.from, .bytes = run.bytes});
               }
               st.backend->copy_runs(copies);
             },
         .describe = [&](int home, std::vector<int32_t>&) { return sends.bytes_to[home]; }},
        kPhase);
  };

  LowLatencyCombineResult out;
  out.combined_x = state->combined;
  launch(state, send, a.return_recv_hook, a.async_finish, out.hook, out.event);
  return out;
}

void LowLatencyMode::receive_combine(CallState& st) {
  const CallState& d = *st.dispatched;
  const int R = st.ranks, K = st.topk, H = st.shape.hidden;
  std::vector<int64_t> waited;
  const std::vector<LlRecord> records = receive_all(st, waited, kPhase);
  const uint64_t row_bytes = 2 * static_cast<uint64_t>(H);
  std::vector<const uint16_t*> from(static_cast<size_t>(R), nullptr);
  for (int s = 0; s < R; ++s) {
    if (masked_[static_cast<size_t>(s)]) continue;  // its rows are skipped (nullptr below)
    require(records[s].eager_bytes == static_cast<uint64_t>(d.sent_to[s]) * row_bytes, kPhase,
            "rank {} sent back {} bytes for the {} tokens this rank dispatched to it", s,
            records[s].eager_bytes, d.sent_to[s]);
    if (d.sent_to[s] > 0)
      from[s] = reinterpret_cast<const uint16_t*>(session_.channel(s).eager(st.call));
  }
  RowBackend& backend = *st.backend;
  if (d.routing) {
    // Each (token, k)'s row found on the device by the dispatch's routing (the message index
    // the host route() calls slot_of).
    backend.ll_combine_routed(*d.routing, d.shape.experts / R, from, st.weights.data<float>(),
                              st.out, static_cast<uint32_t>(H));
  } else {
    // Each (token, k)'s row where its destination sent it back (null: not sent, or masked).
    std::vector<const uint16_t*> rows(static_cast<size_t>(st.num_tokens) * K);
    for (size_t i = 0; i < rows.size(); ++i) {
      const int dest = d.dest_of[i];
      rows[i] = dest < 0 || from[dest] == nullptr
                    ? nullptr
                    : from[dest] + static_cast<size_t>(d.slot_of[i]) * H;
    }
    backend.ll_combine(rows, st.weights.data<float>(), st.out, K, static_cast<uint32_t>(H));
  }
  if (st.wait_stats.defined()) backend.add(st.wait_stats, std::span<const int64_t>(waited));
}

}  // namespace proxyep::integrations::low_latency
