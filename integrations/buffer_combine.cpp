// Buffer::combine, CPU backend: every rank sends each received row back to its source, as a
// block per source in receive order (rows from one source are contiguous there); the source
// lays the blocks out by sending rank and reduces each token over the ranks that received it, in
// float32, in ascending rank order, then adds the biases (the order reference.hpp defines).
#include "integrations/buffer_impl.hpp"
#include "integrations/buffer_rows.hpp"

#include <cstring>

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
          a.x.describe());
  ep::require_contiguous(a.x, kPhase, "x");
  const int64_t hidden = a.x.cols;
  require(hidden > 0 && (hidden * 2) % ep::kRowUnitBytes == 0, kPhase,
          "hidden * 2 bytes must be a positive multiple of {}; x is {}", ep::kRowUnitBytes,
          a.x.describe());
  int topk = 0;
  if (a.topk_weights.defined()) {
    ep::require_dtype(a.topk_weights, DType::f32, kPhase, "topk_weights");
    ep::require_contiguous(a.topk_weights, kPhase, "topk_weights");
    require(a.topk_weights.dims == 2 && a.topk_weights.rows == a.x.rows, kPhase,
            "topk_weights must be [{}, num_topk]; got {}", a.x.rows, a.topk_weights.describe());
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
  // This rank receives back one row per (token, destination) it dispatched.
  require(ep::RowAreas::bound(static_cast<uint64_t>(h.num_tokens) * R, format) <= data_capacity(),
          kPhase, "{} tokens with {} bytes per row from {} ranks do not fit num_nvl_bytes ({})",
          h.num_tokens, format.row_bytes(), R, data_capacity());
  require_staging(rows_to, format, kPhase);

  const uint64_t call = begin_call();
  NotifyHeader header;
  header.kind = static_cast<uint32_t>(CallKind::combine);
  header.num_tokens = static_cast<uint32_t>(h.num_tokens);
  header.format = format;
  header.chunk_bytes = chunk_bytes;
  auto records = exchange_notify(call, header, rows_to, {}, kPhase);
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
  // At source s, the block from rank r starts after the blocks of ranks below r.
  auto block_base = [&](int s, int r) {
    int64_t base = 0;
    for (int q = 0; q < r; ++q)
      base += dispatched(s, q);
    return base;
  };
  auto block_total = [&](int s) { return block_base(s, R); };
  if (counters)
    for (int r = 0; r < R; ++r)
      if (!node->on_node(r))
        expect_rows(call, r,
                    writes_for(static_cast<uint64_t>(dispatched(rank, r)), format,
                               records[r].header.chunk_bytes),
                    kPhase);

  // ---- rows: the block for source s is x rows [prefix[s-1][me], prefix[s][me]) ----
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* w = topk > 0 ? a.topk_weights.as<float>() : nullptr;
  const uint64_t row_bytes = format.hidden_bytes;
  uint64_t staging_at = 0;
  for (int pass = 0; pass < 2; ++pass) {
    bool remote_pass = pass == 0;
    if (remote_pass && !multi_node) continue;
    for (int s = 0; s < R; ++s) {
      const int64_t n = dispatched(s, rank);
      // This rank's rows for itself stay in x: the reduce reads them there.
      if (n == 0 || s == rank || node->on_node(s) == remote_pass) continue;
      const int64_t first = prefix[s * R + rank] - n;  // this source's first row in x
      std::byte* area;
      int64_t to_row, rows_there;
      if (remote_pass) {
        area = staging_data() + staging_at;
        to_row = 0;
        rows_there = n;
      } else {
        area = data_area(s);
        to_row = block_base(s, rank);
        rows_there = block_total(s);
      }
      auto areas = ep::RowAreas::of(static_cast<uint64_t>(rows_there), format);
      copy_rows(*executor, area + areas.x + to_row * row_bytes, x + first * row_bytes, n, row_bytes,
                n);
      if (w != nullptr)
        copy_rows(*executor, area + areas.weights + to_row * 4 * topk,
                  reinterpret_cast<const std::byte*>(w + first * topk), n, 4ull * topk, n);
      if (remote_pass) {
        post_rows(call, s, staging_at, static_cast<uint64_t>(n),
                  static_cast<uint64_t>(block_base(s, rank)), static_cast<uint64_t>(block_total(s)),
                  format, kPhase);
        staging_at += areas.end;
      } else {
        mark_done(call, s);
      }
    }
  }
  std::vector<uint8_t> from(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    from[r] = r != rank && dispatched(rank, r) > 0;
  wait_rows(call, from, kPhase);

  // ---- reduce ----
  CombineResult out;
  out.combined_x = Tensor::empty(DType::bf16, h.num_tokens, hidden);
  if (topk > 0) out.combined_topk_weights = Tensor::empty(DType::f32, h.num_tokens, topk);
  const std::byte* mine = data_area(rank);
  auto areas = ep::RowAreas::of(static_cast<uint64_t>(block_total(rank)), format);
  const int64_t self_first = prefix[rank * R + rank] - dispatched(rank, rank);  // in x
  std::vector<const uint16_t*> block_rows(static_cast<size_t>(R));
  std::vector<const float*> block_weights(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    if (r == rank) {
      block_rows[r] = a.x.as<uint16_t>() + self_first * hidden;
      block_weights[r] = w != nullptr ? w + self_first * topk : nullptr;
    } else {
      block_rows[r] =
          reinterpret_cast<const uint16_t*>(mine + areas.x) + block_base(rank, r) * hidden;
      block_weights[r] =
          reinterpret_cast<const float*>(mine + areas.weights) + block_base(rank, r) * topk;
    }
  }
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
  quiet(kPhase);
  return out;
}

}  // namespace proxyep
