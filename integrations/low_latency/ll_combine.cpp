// low_latency_combine: checks, the send phase (each received row back to its home rank, in the
// order it arrived) and the receive phase (the weighted reduce) (low_latency_mode.hpp).
#include "common/error.hpp"
#include "integrations/low_latency/ll_args.hpp"
#include "integrations/low_latency/ll_tensors.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::low_latency {

namespace {

constexpr const char* kPhase = "low_latency_combine";

}  // namespace

LowLatencyCombineResult LowLatencyMode::combine(const LowLatencyCombineArgs& a) {
  calls_.check_usable(kPhase);
  const std::byte* x = check_combine_args(a, buffer_id_, combine_buffer_);
  std::shared_ptr<const CallState> dispatched = a.handle->dispatched;
  const CallState& d = *dispatched;
  const int R = d.ranks, local = d.shape.experts / R, H = d.shape.hidden;
  calls_.check_can_begin(CallKind::deferred, kPhase);

  auto state = std::make_shared<CallState>();
  CallState& st = *state;
  st.buffer_id = buffer_id_;
  st.kind = LlKind::combine;
  st.shape = d.shape;
  st.format = ep::LlFormat{.hidden = static_cast<uint32_t>(H), .fp8 = false};
  st.ranks = R;
  st.num_tokens = d.num_tokens;
  st.topk = d.topk;
  st.dispatched = dispatched;
  st.backend = &backend_;  // device tensors are staged through the host (device_ll_calls.hpp)
  st.wait_stats = a.combine_wait_recv_cost_stats;
  st.weights.resize(static_cast<size_t>(d.num_tokens) * d.topk);
  for (int t = 0; t < d.num_tokens; ++t)
    for (int k = 0; k < d.topk; ++k)
      st.weights[static_cast<size_t>(t) * d.topk + k] = a.topk_weights.at<float>(t, k);
  if (a.out.defined()) {
    st.out = const_cast<uint16_t*>(a.out.as<uint16_t>());
  } else {
    st.combined = output(outputs_[combines_++ % 2].combined, ep::DType::bf16, d.num_tokens, H);
    st.out = st.combined.data<uint16_t>();
  }

  // With a hook or async_finish this runs in the background: x (or the zero-copy buffer) is read
  // until the hook returns or the event is set, as a GPU kernel would read it.
  auto send = [this, state, x, local, R, H] {
    const CallState& st = *state;
    const CallState& d = *st.dispatched;
    const uint64_t row_bytes = 2 * static_cast<uint64_t>(H);
    const std::vector<int64_t>& ranges = d.ranges;
    // Home's rows of each local expert, expert by expert: the order in which home packed its
    // messages (ll_dispatch.cpp). `place(home, at)` gets each run's first row and its place.
    auto runs = [&](int home, auto&& place) {
      uint64_t bytes = 0;
      for (int e = 0; e < local; ++e) {
        const int64_t range = ranges[static_cast<size_t>(e) * R + home];
        const int64_t begin = range >> 32, count = range & 0xffffffff;
        place(static_cast<int64_t>(e) * R * d.shape.tokens + begin, count, bytes);
        bytes += static_cast<uint64_t>(count) * row_bytes;
      }
      return bytes;
    };
    send_phase(st,
               {.fill =
                    [&](std::span<const int> homes) {
                      for (int home : homes) {
                        std::byte* slot = session_.channel(home).eager_buffer(st.call);
                        runs(home, [&](int64_t first, int64_t count, uint64_t at) {
                          st.backend->copy_rows(slot + at,
                                                x + static_cast<uint64_t>(first) * row_bytes, count,
                                                row_bytes);
                        });
                      }
                    },
                .describe =
                    [&](int home, std::vector<int32_t>&) {
                      return runs(home, [](int64_t, int64_t, uint64_t) {});
                    }},
               kPhase);
  };

  LowLatencyCombineResult out;
  out.combined_x = st.combined;
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
  // Each (token, k)'s row where its destination sent it back (null: not sent, or masked).
  std::vector<const uint16_t*> rows(static_cast<size_t>(st.num_tokens) * K);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int dest = d.dest_of[i];
    rows[i] = dest < 0 || from[dest] == nullptr
                  ? nullptr
                  : from[dest] + static_cast<size_t>(d.slot_of[i]) * H;
  }
  st.backend->ll_combine(rows, st.weights.data(), st.out, K, static_cast<uint32_t>(H));
  if (st.wait_stats.defined())
    for (int s = 0; s < R; ++s)
      written_at<int64_t>(st.wait_stats, s) += waited[s];
}

}  // namespace proxyep::integrations::low_latency
