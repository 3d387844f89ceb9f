// DeepEP V2's per-slot combine (slot_combine.hpp): the slots travel home as a dispatch, then one
// reduce over the K lanes at home.
#include "integrations/elastic/slot_combine.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/elastic/expand.hpp"
#include "integrations/elastic/host_views.hpp"
#include "integrations/normal/row_counts.hpp"

#include <algorithm>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::elastic {

namespace {

constexpr const char* kPhase = "combine";

// This rank's slots in the order they go home: by home rank, then source token, then lane
// (received rows come grouped by source rank, each source's tokens in order), and the expert
// each is routed by (its home's first: any expert of the home rank takes the row there).
struct Outgoing {
  std::vector<int32_t> slots;
  std::vector<int64_t> experts;
};

Outgoing outgoing_slots(const DispatchHandle& h, const TensorRef& metadata, int me,
                        int local_experts) {
  const int K = static_cast<int>(metadata.cols) - 2;
  const int32_t* m = metadata.as<int32_t>();
  const std::vector<int64_t> from = normal::RowCounts::from_handle(h).received_from_each(me);
  Outgoing out;
  int64_t row = 0;
  for (size_t source = 0; source < from.size(); ++source)
    for (int64_t end = row + from[source]; row < end; ++row)
      for (int k = 0; k < K; ++k) {
        const int32_t slot = m[row * (K + 2) + 2 + k];
        if (slot < 0) continue;
        out.slots.push_back(slot);
        out.experts.push_back(static_cast<int64_t>(source) * local_experts);
      }
  return out;
}

// A [rows, cols] tensor of the backend's (at least one row: a device allocation of none may be
// refused), viewed as `rows` rows.
TensorRef rows_of(Tensor& t, int64_t rows) {
  TensorRef ref = t.ref();
  ref.rows = rows;
  return ref;
}

// Where (token t, lane k) of this rank landed home: row head[t * K + k] of the received rows
// (-1 for a -1 lane). From each rank the slots arrive in (token, lane) order, so each is the
// next row of the block of the rank owning its lane's expert; the counts must agree.
std::vector<int32_t> landed_rows(const TensorRef& topk_idx, const DispatchHandle& back, int me,
                                 int local_experts) {
  const std::vector<int64_t> got = normal::RowCounts::from_handle(back).received_from_each(me);
  std::vector<int64_t> next(got.size(), 0), used(got.size(), 0);
  for (size_t r = 1; r < got.size(); ++r)
    next[r] = next[r - 1] + got[r - 1];
  const int64_t* idx = topk_idx.as<int64_t>();
  const int64_t cells = topk_idx.rows * topk_idx.cols;
  std::vector<int32_t> head(static_cast<size_t>(cells), -1);
  for (int64_t i = 0; i < cells; ++i) {
    if (idx[i] < 0) continue;
    const auto r = static_cast<size_t>(idx[i] / local_experts);
    require(r < got.size() && used[r] < got[r], kPhase,
            "rank {} returned {} slots of this rank's tokens; their lanes name more", r,
            r < got.size() ? got[r] : 0);
    head[static_cast<size_t>(i)] = static_cast<int32_t>(next[r] + used[r]++);
  }
  for (size_t r = 0; r < got.size(); ++r)
    require(used[r] == got[r], kPhase,
            "rank {} returned {} slots of this rank's tokens; their lanes name {}", r, got[r],
            used[r]);
  return head;
}

void check_args(const SlotCombineArgs& a, int ranks) {
  require(a.handle != nullptr, kPhase, "a per-slot combine needs its dispatch's handle");
  require(a.x.defined() && a.x.dtype == ep::DType::bf16 && a.x.dims == 2 && a.x.contiguous(),
          kPhase, "an expanded combine's x must be bf16 [slots, hidden]; got {}", a.x);
  if (a.weights.defined())
    require(a.weights.device == a.x.device && a.weights.dtype == ep::DType::f32 &&
                a.weights.dims == 1 && a.weights.rows >= a.x.rows,
            kPhase, "an expanded combine's topk_weights must be f32 [{}] (one per slot); got {}",
            a.x.rows, a.weights);
  for (const TensorRef* bias : {&a.bias0, &a.bias1})
    if (bias->defined())
      require(bias->device == a.x.device && bias->dtype == ep::DType::bf16 && bias->dims == 2 &&
                  bias->contiguous() && bias->rows == a.handle->num_tokens &&
                  bias->cols == a.x.cols,
              kPhase, "a combine bias must be bf16 [{}, {}] where x is; got {}",
              a.handle->num_tokens, a.x.cols, *bias);
  require(a.num_experts > 0 && a.num_experts % ranks == 0, kPhase,
          "num_experts={} must be a positive multiple of the {} ranks", a.num_experts, ranks);
  require(a.x.cols % ep::kCombineChunk == 0, kPhase, "hidden={} must be a multiple of {}", a.x.cols,
          ep::kCombineChunk);
}

}  // namespace

CombineResult combine_slots(Buffer& buffer, const SlotCombineArgs& a) {
  const int me = buffer.rank(), local_experts = a.num_experts / std::max(1, buffer.group_size());
  check_args(a, buffer.group_size());
  const DispatchHandle& h = *a.handle;
  HostViews host(buffer, kPhase);
  const TensorRef metadata = host(a.metadata), topk_idx = host(a.topk_idx);
  host.wait();
  check_slot_columns(metadata, h.num_recv_tokens, a.x.rows, kPhase);
  const int K = static_cast<int>(metadata.cols) - 2;
  require(topk_idx.defined() && topk_idx.dtype == ep::DType::i64 && topk_idx.dims == 2 &&
              topk_idx.contiguous() && topk_idx.rows == h.num_tokens && topk_idx.cols == K,
          kPhase, "topk_idx must be the dispatch's: i64 [{}, {}]; got {}", h.num_tokens, K,
          topk_idx);

  // 1. This rank's slots, gathered in the order they go home, with their routing and weights.
  const bool on_device = a.x.device != ep::Device::host;
  RowBackend& rows = buffer.row_backend(on_device, kPhase);
  const Outgoing out = outgoing_slots(h, metadata, me, local_experts);
  const auto n = static_cast<int64_t>(out.slots.size());
  const int64_t hidden = a.x.cols;
  const uint64_t row_bytes = static_cast<uint64_t>(hidden) * 2;
  Tensor send_x = rows.allocate(ep::DType::bf16, std::max<int64_t>(n, 1), hidden);
  Tensor send_w, send_idx = rows.allocate(ep::DType::i64, std::max<int64_t>(n, 1), 1);
  std::vector<ep::CopyRun> x_runs, w_runs;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* w = static_cast<const std::byte*>(a.weights.data);
  if (a.weights.defined()) send_w = rows.allocate(ep::DType::f32, std::max<int64_t>(n, 1), 1);
  for (int64_t j = 0; j < n; ++j) {
    const auto slot = static_cast<uint64_t>(out.slots[static_cast<size_t>(j)]);
    x_runs.push_back({send_x.raw() + j * row_bytes, x + slot * row_bytes, row_bytes});
    if (a.weights.defined()) w_runs.push_back({send_w.raw() + j * 4, w + slot * 4, 4});
  }
  rows.copy_runs(x_runs);
  rows.copy_runs(w_runs);
  rows.write(send_idx.raw(), out.experts.data(), out.experts.size() * sizeof(int64_t));

  // 2. Home, as a dispatch routed by those experts (one destination each).
  const TensorRef idx_ref = rows_of(send_idx, n);
  const DispatchLayout layout = buffer.get_dispatch_layout(idx_ref, a.num_experts);
  const DispatchResult back =
      buffer.dispatch(DispatchArgs::routed(rows_of(send_x, n), {}, layout, idx_ref,
                                           a.weights.defined() ? rows_of(send_w, n) : TensorRef{}));

  // 3. Each token's slots summed in lane order after the biases, rounded once: the combine's
  // reduce with the K lanes as its groups; lane k's weight copied from its slot's row.
  const std::vector<int32_t> head = landed_rows(topk_idx, back.handle, me, local_experts);
  Folded sums =
      sum_lanes(rows, back.recv_x.data<uint16_t>(),
                a.weights.defined() ? back.recv_topk_weights.data<float>() : nullptr, head,
                h.num_tokens, K, hidden, a.bias0.defined() ? a.bias0.as<uint16_t>() : nullptr,
                a.bias1.defined() ? a.bias1.as<uint16_t>() : nullptr);
  CombineResult result;
  result.combined_x = std::move(sums.x);
  result.combined_topk_weights = std::move(sums.weights);
  rows.complete(kPhase);
  return result;
}

}  // namespace proxyep::integrations::elastic
