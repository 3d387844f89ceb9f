// Buffer::combine, CPU backend: every rank streams each received row back to its source, in
// receive order (rows from one source are contiguous there); the source reads each rank's rows in
// place (one chunk) or gathers them (several) and reduces each token over the ranks that
// received it, in float32, in ascending rank order, then adds the biases (the order
// reference.hpp defines).
#include "integrations/buffer_impl.hpp"
#include "integrations/buffer_rows.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

constexpr const char* kPhase = "combine";

}  // namespace

CombineResult Buffer::Impl::combine(const CombineArgs& a) {
  check_usable(kPhase);
  require(a.handle != nullptr, kPhase, "combine needs the handle of a dispatch");
  const DispatchHandle& h = *a.handle;
  require(h.buffer_id == id, kPhase, "the handle was made by another Buffer");
  const int R = ranks;
  const int64_t num_recv = h.num_recv_tokens;
  ep::require_dtype(a.x, DType::bf16, kPhase, "x");
  ep::require_host(a.x, kPhase, "x");
  require(a.x.dims == 2 && a.x.rows >= num_recv, kPhase,
          "x must be [num_recv_tokens = {}, hidden] (one row per received token); got {}", num_recv,
          a.x);
  ep::require_contiguous(a.x, kPhase, "x");
  const int64_t hidden = a.x.cols;
  require(hidden > 0 && (hidden * 2) % ep::kRowUnitBytes == 0, kPhase,
          "hidden * 2 bytes must be a positive multiple of {}; x is {}", ep::kRowUnitBytes, a.x);
  int topk = 0;
  if (a.topk_weights.defined()) {
    ep::require_dtype(a.topk_weights, DType::f32, kPhase, "topk_weights");
    ep::require_contiguous(a.topk_weights, kPhase, "topk_weights");
    require(a.topk_weights.dims == 2 && a.topk_weights.rows == a.x.rows, kPhase,
            "topk_weights must be [{}, num_topk]; got {}", a.x.rows, a.topk_weights);
    topk = static_cast<int>(a.topk_weights.cols);
  }
  const TensorRef* biases[] = {&a.bias0, &a.bias1};
  for (int b = 0; b < 2; ++b)
    if (biases[b]->defined()) {
      const char* name = b == 0 ? "bias[0]" : "bias[1]";
      ep::require_dtype(*biases[b], DType::bf16, kPhase, name);
      ep::require_shape(*biases[b], h.num_tokens, hidden, kPhase, name);
      ep::require_contiguous(*biases[b], kPhase, name);
    }
  ep::RowFormat format;
  format.hidden_bytes = static_cast<uint32_t>(hidden * 2);
  format.weights = static_cast<uint32_t>(topk);

  // counts[s][d]: rows s sent to d at dispatch; now d sends them back to s.
  const auto* prefix = h.rank_prefix_matrix.data<int32_t>();
  auto dispatched = [&](int s, int d) { return rows_sent(h, s, d); };
  std::vector<int32_t> rows_to(static_cast<size_t>(R));
  for (int s = 0; s < R; ++s)
    rows_to[s] = static_cast<int32_t>(dispatched(s, rank));
  require_row_fits(format, kPhase);

  // ---- rows: the rows for source s are x rows [prefix[s][me] - n, prefix[s][me]) ----
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* w = topk > 0 ? a.topk_weights.as<float>() : nullptr;
  const uint64_t row_bytes = format.hidden_bytes;
  Transfer transfer;
  transfer.format = format;
  transfer.out.resize(static_cast<size_t>(R));
  transfer.in.resize(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    transfer.out[r] = plan_stream(rank, r, static_cast<uint64_t>(dispatched(r, rank)), format);
    transfer.in[r] = plan_stream(r, rank, static_cast<uint64_t>(dispatched(rank, r)), format);
  }
  transfer.fill = [&](int s, uint64_t first, uint64_t rows, std::byte* slot) {
    const auto areas = ep::RowAreas::of(rows, format);
    const int64_t from = prefix[s * R + rank] - dispatched(s, rank) + static_cast<int64_t>(first);
    const auto n = static_cast<int64_t>(rows);
    copy_rows(*executor, slot + areas.x, x + from * row_bytes, n, row_bytes, n);
    if (w != nullptr)
      copy_rows(*executor, slot + areas.weights,
                reinterpret_cast<const std::byte*>(w + from * topk), n, 4ull * topk, n);
  };
  const uint64_t call = breaking_step([&] { return begin_call(); });
  // Before the records, which publish them.
  breaking_step([&] { send_eager(call, transfer, kPhase); });
  NotifyHeader header;
  header.kind = static_cast<uint32_t>(CallKind::combine);
  header.num_tokens = static_cast<uint32_t>(h.num_tokens);
  header.format = format;
  auto records = breaking_step([&] { return exchange_notify(call, header, rows_to, {}, kPhase); });
  for (int s = 0; s < R; ++s) {
    const NotifyHeader& theirs = records[s].header;
    require(theirs.kind == header.kind && theirs.format == header.format, kPhase,
            "call {}: rank {} called {} with (hidden bytes {}, weights {}), rank {} combine with "
            "({}, {}): every rank must pass the same kind of input",
            call, s, call_name(static_cast<CallKind>(theirs.kind)), theirs.format.hidden_bytes,
            theirs.format.weights, rank, format.hidden_bytes, format.weights);
    for (int d = 0; d < R; ++d)
      require(records[s].rows_to[d] == dispatched(d, s), kPhase,
              "call {}: rank {} returns {} rows to rank {} but this rank's handle says {}: the "
              "ranks passed handles of different dispatches",
              call, s, records[s].rows_to[d], d, dispatched(d, s));
  }

  // Where the reduce reads rank r's rows for this rank's tokens: in place when they came in one
  // chunk (its slot stays untouched until this rank's next call), else gathered here.
  std::vector<const uint16_t*> block_rows(static_cast<size_t>(R), nullptr);
  std::vector<const float*> block_weights(static_cast<size_t>(R), nullptr);
  std::vector<Tensor> gathered_x(static_cast<size_t>(R)), gathered_weights(static_cast<size_t>(R));
  transfer.take = [&](int r, uint64_t, uint64_t first, uint64_t rows, const std::byte* slot) {
    const auto areas = ep::RowAreas::of(rows, format);
    if (transfer.in[r].chunks == 1) {
      block_rows[r] = reinterpret_cast<const uint16_t*>(slot + areas.x);
      block_weights[r] = reinterpret_cast<const float*>(slot + areas.weights);
      return;
    }
    const int64_t total = dispatched(rank, r);
    if (!gathered_x[r].defined()) {
      gathered_x[r] = Tensor::empty(DType::bf16, total, hidden);
      block_rows[r] = gathered_x[r].data<uint16_t>();
      if (topk > 0) {
        gathered_weights[r] = Tensor::empty(DType::f32, total, topk);
        block_weights[r] = gathered_weights[r].data<float>();
      }
    }
    const auto n = static_cast<int64_t>(rows);
    copy_rows(*executor, gathered_x[r].raw() + first * row_bytes, slot + areas.x, n, row_bytes, n);
    if (topk > 0)
      copy_rows(*executor, gathered_weights[r].raw() + first * 4ull * topk, slot + areas.weights, n,
                4ull * topk, n);
  };
  breaking_step([&] { run_transfer(call, transfer, kPhase); });

  // ---- reduce ----
  CombineResult out;
  out.combined_x = Tensor::empty(DType::bf16, h.num_tokens, hidden);
  if (topk > 0) out.combined_topk_weights = Tensor::empty(DType::f32, h.num_tokens, topk);
  // This rank's rows for itself stay in x.
  const int64_t self_first = prefix[rank * R + rank] - dispatched(rank, rank);
  block_rows[rank] = a.x.as<uint16_t>() + self_first * hidden;
  block_weights[rank] = w != nullptr ? w + self_first * topk : nullptr;
  combine_tokens(
      *executor,
      ep::CombineInput{.block_rows = block_rows.data(),
                       .block_weights = topk > 0 ? block_weights.data() : nullptr,
                       .send_head = h.send_head.data<int32_t>(),
                       .bias0 = a.bias0.defined() ? a.bias0.as<uint16_t>() : nullptr,
                       .bias1 = a.bias1.defined() ? a.bias1.as<uint16_t>() : nullptr,
                       .out = out.combined_x.data<uint16_t>(),
                       .out_weights = topk > 0 ? out.combined_topk_weights.data<float>() : nullptr,
                       .num_ranks = R,
                       .hidden = hidden,
                       .topk = topk},
      h.num_tokens);
  breaking_step([&] { quiet(kPhase); });
  return out;
}

}  // namespace proxyep
