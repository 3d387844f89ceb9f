// Buffer::dispatch, CPU backend: validate, plan each token's position at every destination,
// notify, then stream every destination's rows in chunks (stored into a node peer's slots, or
// packed into staging and posted to another node) while copying the chunks that arrive into the
// outputs; the rank's rows to itself go straight into its outputs.
#include "gpu_side/ep/layout.hpp"
#include "integrations/buffer_impl.hpp"
#include "integrations/buffer_rows.hpp"

#include <fmt/format.h>

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

constexpr const char* kPhase = "dispatch";
// More scale words per token than any FP8 layout needs (hidden / 128 for hidden up to 64 Ki).
constexpr int64_t kMaxScaleCols = 512;

struct Checked {
  bool fp8 = false;
  bool cached = false;
  int64_t tokens = 0, hidden = 0;
  int topk = 0;
  bool weights = false;
  int num_experts = 0;
  ep::RowFormat format;
};

Checked check_args(const Buffer::Impl& impl, const DispatchArgs& a) {
  Checked c;
  ep::require_defined(a.x, kPhase, "x");
  ep::require_host(a.x, kPhase, "x");
  require(a.x.dims == 2, kPhase, "x must be 2-D [num_tokens, hidden]; got {}", a.x);
  ep::require_contiguous(a.x, kPhase, "x");
  require(a.x.dtype == DType::bf16 || a.x.dtype == DType::fp8_e4m3, kPhase,
          "x must be bf16, or float8_e4m3fn with x_scales; got {}", a.x);
  c.fp8 = a.x.dtype == DType::fp8_e4m3;
  c.tokens = a.x.rows;
  c.hidden = a.x.cols;
  require(c.tokens <= kMaxStreamRows, kPhase, "x has {} tokens; at most {} per call", c.tokens,
          kMaxStreamRows);
  const int64_t hidden_bytes = c.hidden * static_cast<int64_t>(ep::dtype_size(a.x.dtype));
  require(hidden_bytes > 0 && hidden_bytes % ep::kRowUnitBytes == 0, kPhase,
          "hidden * element size must be a positive multiple of {} bytes; x is {} ({} bytes)",
          ep::kRowUnitBytes, a.x, hidden_bytes);
  c.format.hidden_bytes = static_cast<uint32_t>(hidden_bytes);
  if (c.fp8) {
    // DeepEP moves the scales as opaque 4-byte words, as many per token as x_scales has columns:
    // float32 [tokens, hidden / 128], or int32 [tokens, hidden / 512] packing four UE8M0 bytes.
    ep::require_defined(a.x_scales, kPhase, "x_scales (FP8 x)");
    ep::require_host(a.x_scales, kPhase, "x_scales");
    require(a.x_scales.dtype == DType::f32 || a.x_scales.dtype == DType::i32, kPhase,
            "x_scales must be float32 (or int32 packed UE8M0); got {}", a.x_scales);
    require(a.x_scales.dims == 2 && a.x_scales.rows == c.tokens && a.x_scales.cols >= 1 &&
                a.x_scales.cols <= kMaxScaleCols,
            kPhase, "x_scales must be 2-D [num_tokens = {}, 1..{} scales]; got {}", c.tokens,
            kMaxScaleCols, a.x_scales);
    c.format.scale_cols = static_cast<uint32_t>(a.x_scales.cols);
  } else {
    require(!a.x_scales.defined(), kPhase, "x_scales given with bf16 x (scales go with FP8 x)");
  }
  require(a.expert_alignment >= 1, kPhase, "expert_alignment must be >= 1; got {}",
          a.expert_alignment);
  require(a.num_worst_tokens >= 0, kPhase, "num_worst_tokens must be >= 0; got {}",
          a.num_worst_tokens);

  const int R = impl.ranks;
  if (a.handle != nullptr) {
    c.cached = true;
    const DispatchHandle& h = *a.handle;
    require(h.buffer_id == impl.id, kPhase, "the handle was made by another Buffer");
    require(!a.topk_idx.defined() && !a.topk_weights.defined(), kPhase,
            "cached dispatch (handle given) takes no topk_idx/topk_weights");
    require(h.num_tokens == c.tokens, kPhase, "x has {} tokens but the handle was made for {}",
            c.tokens, h.num_tokens);
    require(a.num_worst_tokens == 0, kPhase, "num_worst_tokens is not used with a handle");
    return c;
  }
  ep::require_dtype(a.num_tokens_per_rank, DType::i32, kPhase, "num_tokens_per_rank");
  ep::require_shape(a.num_tokens_per_rank, R, -1, kPhase, "num_tokens_per_rank");
  ep::require_dtype(a.is_token_in_rank, DType::boolean, kPhase, "is_token_in_rank");
  ep::require_shape(a.is_token_in_rank, c.tokens, R, kPhase, "is_token_in_rank");
  ep::require_contiguous(a.is_token_in_rank, kPhase, "is_token_in_rank");
  ep::require_dtype(a.num_tokens_per_expert, DType::i32, kPhase, "num_tokens_per_expert");
  require(a.num_tokens_per_expert.dims == 1, kPhase,
          "num_tokens_per_expert must be 1-D [num_experts]; got {}", a.num_tokens_per_expert);
  c.num_experts = static_cast<int>(a.num_tokens_per_expert.rows);
  require(c.num_experts > 0 && c.num_experts % R == 0, kPhase,
          "num_experts ({}) must be a positive multiple of the number of ranks ({})", c.num_experts,
          R);
  require(c.num_experts / R <= ep::kMaxLocalExperts, kPhase,
          "{} experts per rank exceed the limit of {}", c.num_experts / R, ep::kMaxLocalExperts);
  if (a.topk_idx.defined()) {
    ep::validate_topk_idx(a.topk_idx, impl.shape_for(c.num_experts), kPhase);
    require(a.topk_idx.rows == c.tokens, kPhase, "topk_idx has {} rows but x has {} tokens",
            a.topk_idx.rows, c.tokens);
    c.topk = static_cast<int>(a.topk_idx.cols);
    c.format.topk = static_cast<uint32_t>(c.topk);
    if (a.topk_weights.defined()) {
      ep::require_dtype(a.topk_weights, DType::f32, kPhase, "topk_weights");
      ep::require_shape(a.topk_weights, c.tokens, c.topk, kPhase, "topk_weights");
      ep::require_contiguous(a.topk_weights, kPhase, "topk_weights");
      c.weights = true;
      c.format.weights = static_cast<uint32_t>(c.topk);
    }
  } else {
    require(!a.topk_weights.defined(), kPhase, "topk_weights given without topk_idx");
    require(a.num_worst_tokens == 0, kPhase, "num_worst_tokens needs topk_idx");
  }
  c.format.src_index = 1;
  // The layout tensors must describe x: a wrong count would misplace rows at the receivers.
  const auto* in_rank = a.is_token_in_rank.as<bool>();
  const auto* per_rank = a.num_tokens_per_rank.as<int32_t>();
  for (int d = 0; d < R; ++d) {
    int64_t marked = 0;
    for (int64_t t = 0; t < c.tokens; ++t)
      marked += in_rank[t * R + d] ? 1 : 0;
    require(marked == per_rank[d], kPhase,
            "num_tokens_per_rank[{}] is {} but is_token_in_rank marks {} tokens for rank {}", d,
            per_rank[d], marked, d);
  }
  return c;
}

}  // namespace

DispatchResult Buffer::Impl::dispatch(const DispatchArgs& a) {
  check_usable(kPhase);
  Checked c = check_args(*this, a);
  const int R = ranks;
  const DispatchHandle* cached = a.handle;
  if (c.cached) c.format.src_index = 0;  // the handle already holds recv_src_idx
  // Rows stream through the Buffer's slots in chunks, so any number of tokens fits as long as
  // one row fits a slot.
  require_row_fits(c.format, kPhase);

  // Where each token goes: send_head[t][d] = its position among the rows sent to d.
  Tensor send_head;
  Tensor in_rank_copy;
  std::vector<int32_t> rows_to(static_cast<size_t>(R), 0);
  if (c.cached) {
    send_head = cached->send_head;
    in_rank_copy = cached->is_token_in_rank;
    for (int d = 0; d < R; ++d)
      rows_to[d] = static_cast<int32_t>(rows_sent(*cached, rank, d));
  } else {
    in_rank_copy = Tensor::copy_of(a.is_token_in_rank);
    send_head = Tensor::empty(DType::i32, c.tokens, R);
    const auto* in_rank = in_rank_copy.data<bool>();
    auto* head = send_head.data<int32_t>();
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int d = 0; d < R; ++d)
        head[t * R + d] = in_rank[t * R + d] ? rows_to[d]++ : -1;
  }

  // ---- what this rank sends: its streams, and their rows ----
  RowSource source{a.x,
                   a.x_scales,
                   c.cached ? TensorRef{} : a.topk_idx,
                   c.cached ? TensorRef{} : a.topk_weights,
                   c.format,
                   shape_for(c.num_experts)};
  const auto* in_rank = in_rank_copy.data<bool>();
  const auto* head = send_head.data<int32_t>();
  // The tokens of each destination's rows, in row order.
  std::vector<std::vector<int32_t>> tokens_to(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d)
    if (d != rank) tokens_to[d].resize(static_cast<size_t>(rows_to[d]));
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int d = 0; d < R; ++d)
      if (d != rank && in_rank[t * R + d]) tokens_to[d][head[t * R + d]] = static_cast<int32_t>(t);

  Transfer transfer;
  transfer.format = c.format;
  transfer.out.resize(static_cast<size_t>(R));
  transfer.in.resize(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    transfer.out[r] = plan_stream(rank, r, static_cast<uint64_t>(rows_to[r]), c.format);
  transfer.fill = [&](int d, uint64_t first, uint64_t rows, std::byte* slot) {
    const RowSink sink = RowSink::at(slot, ep::RowAreas::of(rows, c.format), 0, d);
    const int32_t* tokens = tokens_to[d].data() + first;
    for_each_token_block(*executor, static_cast<int64_t>(rows), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        write_row(source, sink, i, tokens[i]);
    });
  };

  // ---- notify ----
  const uint64_t call = breaking_step([&] { return begin_call(); });
  // Before the records, which publish them.
  breaking_step([&] { send_eager(call, transfer, kPhase); });
  NotifyHeader header;
  header.kind = static_cast<uint32_t>(c.cached ? CallKind::cached_dispatch : CallKind::dispatch);
  header.num_tokens = static_cast<uint32_t>(c.tokens);
  header.format = c.format;
  header.num_experts = static_cast<uint32_t>(c.num_experts);
  header.expert_alignment = static_cast<uint32_t>(a.expert_alignment);
  header.num_worst_tokens = static_cast<uint32_t>(a.num_worst_tokens);
  const int local_experts = c.num_experts / R;
  const auto* per_expert = c.cached ? nullptr : a.num_tokens_per_expert.as<int32_t>();
  auto records = breaking_step([&] {
    return exchange_notify(
        call, header, rows_to,
        [&](int d) {
          return c.cached ? std::span<const int32_t>{}
                          : std::span<const int32_t>(per_expert + d * local_experts,
                                                     static_cast<size_t>(local_experts));
        },
        kPhase);
  });
  // Every rank sees every record, so a disagreement fails everywhere with the same message.
  for (int s = 0; s < R; ++s) {
    const NotifyHeader& h = records[s].header;
    require(
        h.kind == header.kind && h.format == header.format && h.num_experts == header.num_experts,
        kPhase,
        "call {}: rank {} called {} with row format (hidden bytes {}, scales {}, topk {}, "
        "weights {}) and {} experts, rank {} {} with ({}, {}, {}, {}) and {}: every rank "
        "must pass the same kind of input",
        call, s, call_name(static_cast<CallKind>(h.kind)), h.format.hidden_bytes,
        h.format.scale_cols, h.format.topk, h.format.weights, h.num_experts, rank,
        call_name(static_cast<CallKind>(header.kind)), header.format.hidden_bytes,
        header.format.scale_cols, header.format.topk, header.format.weights, header.num_experts);
  }
  // counts[s][d]: rows s sends to d.
  std::vector<int64_t> counts(static_cast<size_t>(R) * R);
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d)
      counts[s * R + d] = records[s].rows_to[d];
  if (c.cached) {
    for (int s = 0; s < R; ++s)
      for (int d = 0; d < R; ++d) {
        int64_t expected = rows_sent(*cached, s, d);
        require(counts[s * R + d] == expected, kPhase,
                "call {}: rank {} sends {} rows to rank {} but this rank's handle says {}: the "
                "ranks passed handles of different dispatches",
                call, s, counts[s * R + d], d, expected);
      }
  }
  std::vector<int64_t> total(static_cast<size_t>(R), 0);
  for (int d = 0; d < R; ++d)
    for (int s = 0; s < R; ++s)
      total[d] += counts[s * R + d];
  for (int d = 0; d < R; ++d) {
    uint32_t worst = records[d].header.num_worst_tokens;
    require(worst == 0 || total[d] <= worst, kPhase,
            "call {}: rank {} receives {} tokens, more than its num_worst_tokens {}", call, d,
            total[d], worst);
  }
  const int64_t num_recv = total[rank];

  // ---- outputs, allocated before the rows move: this rank's rows to itself go straight into
  // them (for 2 ranks that is half the traffic, one copy instead of two) ----
  DispatchResult out;
  const int64_t rows_out = a.num_worst_tokens > 0 ? a.num_worst_tokens : num_recv;
  out.recv_x = Tensor::empty(a.x.dtype, rows_out, c.hidden);
  if (c.fp8) out.recv_x_scales = Tensor::empty(a.x_scales.dtype, rows_out, c.format.scale_cols);
  if (c.topk > 0) out.recv_topk_idx = Tensor::empty(DType::i64, rows_out, c.topk);
  if (c.weights) out.recv_topk_weights = Tensor::empty(DType::f32, rows_out, c.topk);
  if (!c.cached) out.handle.recv_src_idx = Tensor::empty(DType::i32, num_recv);
  // Where the rows of source s start in this rank's receive order.
  std::vector<int64_t> recv_offset(static_cast<size_t>(R), 0);
  for (int s = 1; s < R; ++s)
    recv_offset[s] = recv_offset[s - 1] + counts[(s - 1) * R + rank];
  RowSink self;
  self.x = out.recv_x.raw();
  self.scales = c.fp8 ? out.recv_x_scales.data<uint32_t>() : nullptr;
  self.topk_idx = c.topk > 0 ? out.recv_topk_idx.data<int64_t>() : nullptr;
  self.weights = c.weights ? out.recv_topk_weights.data<float>() : nullptr;
  self.src_index = c.cached ? nullptr : out.handle.recv_src_idx.data<int32_t>();
  self.first_row = recv_offset[rank];
  self.rank = rank;

  // ---- rows ----
  for (int r = 0; r < R; ++r)
    transfer.in[r] = plan_stream(r, rank, static_cast<uint64_t>(counts[r * R + rank]), c.format);
  transfer.local = [&] {
    for_each_token_block(*executor, c.tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        if (in_rank[t * R + rank]) write_row(source, self, head[t * R + rank], t);
    });
  };
  transfer.take = [&](int s, uint64_t, uint64_t first, uint64_t rows, const std::byte* slot) {
    const auto areas = ep::RowAreas::of(rows, c.format);
    const auto n = static_cast<int64_t>(rows);
    const int64_t at = recv_offset[s] + static_cast<int64_t>(first);
    auto copy = [&](Tensor& to, uint64_t area, uint64_t unit) {
      copy_rows(*executor, to.raw() + at * unit, slot + area, n, unit, n);
    };
    copy(out.recv_x, areas.x, c.format.hidden_bytes);
    if (c.fp8) copy(out.recv_x_scales, areas.scales, 4ull * c.format.scale_cols);
    if (c.topk > 0) copy(out.recv_topk_idx, areas.topk_idx, 8ull * c.topk);
    if (c.weights) copy(out.recv_topk_weights, areas.weights, 4ull * c.topk);
    if (!c.cached) copy(out.handle.recv_src_idx, areas.src_index, 4);
  };
  breaking_step([&] { run_transfer(call, transfer, kPhase); });

  // ---- the num_worst_tokens tail: zero rows, -1 selections ----
  if (rows_out > num_recv) {
    auto clear = [&](Tensor& t, uint64_t unit) {
      std::memset(t.raw() + num_recv * unit, 0, static_cast<size_t>(rows_out - num_recv) * unit);
    };
    clear(out.recv_x, c.format.hidden_bytes);
    if (c.fp8) clear(out.recv_x_scales, 4ull * c.format.scale_cols);
    if (c.weights) clear(out.recv_topk_weights, 4ull * c.topk);
    if (c.topk > 0) {
      auto* idx = out.recv_topk_idx.data<int64_t>();
      std::fill(idx + num_recv * c.topk, idx + rows_out * c.topk, int64_t{-1});
    }
  }
  if (c.cached) {
    out.handle = *cached;
  } else {
    out.handle.rank_prefix_matrix = Tensor::empty(DType::i32, R, R);
    auto* prefix = out.handle.rank_prefix_matrix.data<int32_t>();
    for (int s = 0; s < R; ++s)
      for (int d = 0; d < R; ++d)
        prefix[s * R + d] =
            static_cast<int32_t>(counts[s * R + d] + (s > 0 ? prefix[(s - 1) * R + d] : 0));
    out.handle.is_token_in_rank = in_rank_copy;
    out.handle.send_head = send_head;
    out.handle.num_tokens = static_cast<int>(c.tokens);
    out.handle.num_recv_tokens = static_cast<int>(num_recv);
    out.handle.hidden = static_cast<int>(c.hidden);
    out.handle.buffer_id = id;
    if (a.num_worst_tokens == 0) {
      out.num_recv_tokens_per_expert.assign(static_cast<size_t>(local_experts), 0);
      for (int s = 0; s < R; ++s)
        for (int e = 0; e < local_experts; ++e)
          out.num_recv_tokens_per_expert[e] += records[s].experts.at(static_cast<size_t>(e));
      for (int& n : out.num_recv_tokens_per_expert)
        n = (n + a.expert_alignment - 1) / a.expert_alignment * a.expert_alignment;
    }
  }
  breaking_step([&] { quiet(kPhase); });  // the staging area is rewritten by the next call
  return out;
}

}  // namespace proxyep
