// Buffer::dispatch, CPU backend: validate, plan each token's position at every destination,
// notify, then write every row straight to its final offset in the destination's arena (node
// peers) or pack it into staging and post it (other nodes), wait for every source, copy out.
#include "gpu_side/ep/layout.hpp"
#include "integrations/buffer_impl.hpp"
#include "integrations/buffer_rows.hpp"

#include <fmt/format.h>

#include <cstring>

namespace proxyep {

namespace {

constexpr const char* kPhase = "dispatch";

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
  require(a.x.dims == 2, kPhase, "x must be 2-D [num_tokens, hidden]; got {}", a.x.describe());
  ep::require_contiguous(a.x, kPhase, "x");
  require(a.x.dtype == DType::bf16 || a.x.dtype == DType::fp8_e4m3, kPhase,
          "x must be bf16, or float8_e4m3fn with x_scales; got {}", a.x.describe());
  c.fp8 = a.x.dtype == DType::fp8_e4m3;
  c.tokens = a.x.rows;
  c.hidden = a.x.cols;
  const int64_t hidden_bytes = c.hidden * static_cast<int64_t>(ep::dtype_size(a.x.dtype));
  require(hidden_bytes > 0 && hidden_bytes % ep::kRowUnitBytes == 0, kPhase,
          "hidden * element size must be a positive multiple of {} bytes; x is {} ({} bytes)",
          ep::kRowUnitBytes, a.x.describe(), hidden_bytes);
  c.format.hidden_bytes = static_cast<uint32_t>(hidden_bytes);
  if (c.fp8) {
    require(c.hidden % ep::kScaleBlock == 0, kPhase,
            "FP8 x needs hidden divisible by {} (one scale per block); got {}", ep::kScaleBlock,
            a.x.describe());
    ep::require_defined(a.x_scales, kPhase, "x_scales (FP8 x)");
    ep::require_host(a.x_scales, kPhase, "x_scales");
    require(a.x_scales.dtype == DType::f32 || a.x_scales.dtype == DType::i32, kPhase,
            "x_scales must be float32 (or int32 packed UE8M0); got {}", a.x_scales.describe());
    ep::require_shape(a.x_scales, c.tokens, c.hidden / ep::kScaleBlock, kPhase, "x_scales");
    c.format.scale_cols = static_cast<uint32_t>(c.hidden / ep::kScaleBlock);
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
          "num_tokens_per_expert must be 1-D [num_experts]; got {}",
          a.num_tokens_per_expert.describe());
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
  if (c.cached) {
    c.format.scale_cols = c.fp8 ? static_cast<uint32_t>(c.hidden / ep::kScaleBlock) : 0;
    c.format.src_index = 0;  // the handle already holds recv_src_idx
  }
  // Every rank may send up to num_tokens rows here: that is what num_nvl_bytes was sized for.
  uint64_t worst_rows = static_cast<uint64_t>(c.tokens) * static_cast<uint64_t>(R);
  if (a.num_worst_tokens > 0) worst_rows = std::max<uint64_t>(worst_rows, a.num_worst_tokens);
  require(ep::RowAreas::bound(worst_rows, c.format) <= data_capacity(), kPhase,
          "{} tokens of {} bytes per row from each of {} ranks need {} bytes but the Buffer "
          "holds {} (num_nvl_bytes): more tokens than the Buffer was sized for "
          "(Buffer::nvl_bytes_hint)",
          c.tokens, c.format.row_bytes(), R, ep::RowAreas::bound(worst_rows, c.format),
          data_capacity());

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
  require_staging(rows_to, c.format, kPhase);

  // ---- notify ----
  const uint64_t call = begin_call();
  NotifyHeader header;
  header.kind = static_cast<uint32_t>(c.cached ? CallKind::cached_dispatch : CallKind::dispatch);
  header.num_tokens = static_cast<uint32_t>(c.tokens);
  header.format = c.format;
  header.num_experts = static_cast<uint32_t>(c.num_experts);
  header.expert_alignment = static_cast<uint32_t>(a.expert_alignment);
  header.chunk_bytes = chunk_bytes;
  header.num_worst_tokens = static_cast<uint32_t>(a.num_worst_tokens);
  const int local_experts = c.num_experts / R;
  const auto* per_expert = c.cached ? nullptr : a.num_tokens_per_expert.as<int32_t>();
  auto records = exchange_notify(
      call, header, rows_to,
      [&](int d) {
        return c.cached ? std::span<const int32_t>{}
                        : std::span<const int32_t>(per_expert + d * local_experts,
                                                   static_cast<size_t>(local_experts));
      },
      kPhase);
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
  std::vector<int64_t> total(static_cast<size_t>(R), 0), base(static_cast<size_t>(R), 0);
  for (int d = 0; d < R; ++d)
    for (int s = 0; s < R; ++s) {
      if (s < rank) base[d] += counts[s * R + d];
      total[d] += counts[s * R + d];
    }
  for (int d = 0; d < R; ++d) {
    uint32_t worst = records[d].header.num_worst_tokens;
    require(worst == 0 || total[d] <= worst, kPhase,
            "call {}: rank {} receives {} tokens, more than its num_worst_tokens {}", call, d,
            total[d], worst);
  }
  const int64_t num_recv = total[rank];
  if (counters)
    for (int s = 0; s < R; ++s)
      if (!node->on_node(s))
        expect_rows(call, s,
                    writes_for(static_cast<uint64_t>(counts[s * R + rank]), c.format,
                               records[s].header.chunk_bytes),
                    kPhase);

  // ---- outputs, allocated before the rows move: this rank's rows to itself go straight into
  // them (for 2 ranks that is half the traffic, one copy instead of two) ----
  DispatchResult out;
  const int64_t rows_out = a.num_worst_tokens > 0 ? a.num_worst_tokens : num_recv;
  out.recv_x = Tensor::empty(a.x.dtype, rows_out, c.hidden);
  if (c.fp8) out.recv_x_scales = Tensor::empty(a.x_scales.dtype, rows_out, c.format.scale_cols);
  if (c.topk > 0) out.recv_topk_idx = Tensor::empty(DType::i64, rows_out, c.topk);
  if (c.weights) out.recv_topk_weights = Tensor::empty(DType::f32, rows_out, c.topk);
  if (!c.cached) out.handle.recv_src_idx = Tensor::empty(DType::i32, num_recv);
  RowSink self;
  self.x = out.recv_x.raw();
  self.scales = c.fp8 ? out.recv_x_scales.data<uint32_t>() : nullptr;
  self.topk_idx = c.topk > 0 ? out.recv_topk_idx.data<int64_t>() : nullptr;
  self.weights = c.weights ? out.recv_topk_weights.data<float>() : nullptr;
  self.src_index = c.cached ? nullptr : out.handle.recv_src_idx.data<int32_t>();
  self.first_row = base[rank];
  self.rank = rank;

  // ---- rows ----
  RowSource source{a.x,
                   a.x_scales,
                   c.cached ? TensorRef{} : a.topk_idx,
                   c.cached ? TensorRef{} : a.topk_weights,
                   c.format,
                   shape_for(c.num_experts)};
  std::vector<RowSink> sinks(static_cast<size_t>(R));
  uint64_t staging_at = 0;
  std::vector<uint64_t> staging_offset(static_cast<size_t>(R), 0);
  for (int d = 0; d < R; ++d) {
    if (d == rank) {
      sinks[d] = self;
    } else if (node->on_node(d)) {
      sinks[d] = RowSink::at(data_area(d), ep::RowAreas::of(total[d], c.format), base[d], d);
    } else {
      staging_offset[d] = staging_at;
      sinks[d] = RowSink::at(staging_data() + staging_at,
                             ep::RowAreas::of(counts[rank * R + d], c.format), 0, d);
      staging_at += ep::RowAreas::of(counts[rank * R + d], c.format).end;
    }
  }
  const auto* in_rank = in_rank_copy.data<bool>();
  const auto* head = send_head.data<int32_t>();
  // Rows for other nodes first, so the fabric works while the node's rows are copied.
  for (int pass = 0; pass < 2; ++pass) {
    bool remote_pass = pass == 0;
    if (remote_pass && !multi_node) continue;
    for_each_token_block(*executor, c.tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int d = 0; d < R; ++d)
          if (in_rank[t * R + d] && node->on_node(d) != remote_pass)
            write_row(source, sinks[d], head[t * R + d], t);
    });
    if (remote_pass)
      for (int d = 0; d < R; ++d)
        if (!node->on_node(d) && counts[rank * R + d] > 0)
          post_rows(call, d, staging_offset[d], static_cast<uint64_t>(counts[rank * R + d]),
                    static_cast<uint64_t>(base[d]), static_cast<uint64_t>(total[d]), c.format,
                    kPhase);
  }
  for (int d = 0; d < R; ++d)
    if (d != rank && node->on_node(d) && counts[rank * R + d] > 0) mark_done(call, d);

  std::vector<uint8_t> from(static_cast<size_t>(R));
  for (int s = 0; s < R; ++s)
    from[s] = s != rank && counts[s * R + rank] > 0;
  wait_rows(call, from, kPhase);

  // ---- copy out every other source's rows: those before this rank's block and after it ----
  auto areas = ep::RowAreas::of(num_recv, c.format);
  const std::byte* mine = data_area(rank);
  const int64_t self_begin = base[rank], self_end = base[rank] + counts[rank * R + rank];
  auto copy_out = [&](std::byte* to, uint64_t area, uint64_t unit) {
    copy_rows(*executor, to, mine + area, self_begin, unit, self_begin);
    copy_rows(*executor, to + self_end * unit, mine + area + self_end * unit, num_recv - self_end,
              unit, rows_out - self_end);  // zero-fills the worst-case tail
  };
  copy_out(out.recv_x.raw(), areas.x, c.format.hidden_bytes);
  if (c.fp8) copy_out(out.recv_x_scales.raw(), areas.scales, 4ull * c.format.scale_cols);
  if (c.topk > 0) {
    copy_out(out.recv_topk_idx.raw(), areas.topk_idx, 8ull * c.topk);
    auto* idx = out.recv_topk_idx.data<int64_t>();
    std::fill(idx + num_recv * c.topk, idx + rows_out * c.topk, int64_t{-1});
  }
  if (c.weights) copy_out(out.recv_topk_weights.raw(), areas.weights, 4ull * c.topk);
  if (!c.cached) {
    std::byte* src = out.handle.recv_src_idx.raw();
    copy_rows(*executor, src, mine + areas.src_index, self_begin, 4, self_begin);
    copy_rows(*executor, src + self_end * 4, mine + areas.src_index + self_end * 4,
              num_recv - self_end, 4, num_recv - self_end);
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
  quiet(kPhase);  // the staging area is rewritten by the next call
  return out;
}

}  // namespace proxyep
