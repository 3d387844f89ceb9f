// Where received rows land. A receiver's arena holds one call's rows as separate arrays (token
// bytes, FP8 scales, top-k indices, top-k weights, source token indices, forwarding heads), each
// 64-byte aligned,
// rows in receive order. Every sender computes the same offsets from the same inputs (the row
// count and format agreed in the notify phase), so it can write its rows straight to their final
// place, in another process's memory (intranode) or through an RMA write (internode). Shared by
// the CPU twins and the CUDA kernels.
#pragma once

#include "common/host_device.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// What one row carries; every field 0 means "not carried".
struct RowFormat {
  uint32_t hidden_bytes = 0;  // token payload (bf16: hidden * 2, fp8: hidden)
  uint32_t scale_cols = 0;    // 4-byte scales per row (fp8: hidden / 128)
  uint32_t topk = 0;          // top-k indices (int64) per row
  uint32_t weights = 0;       // top-k weights (float32) per row: 0 or topk
  uint32_t src_index = 0;     // 1: a 4-byte source token index per row
  // Hierarchical internode, a row on its way to a forwarder: the row's position among its
  // source's rows to each rank of the destination node (int32, -1: not for that rank), one per
  // rank of the node.
  uint32_t heads = 0;

  PROXYEP_HOST_DEVICE constexpr uint64_t row_bytes() const {
    return uint64_t{hidden_bytes} + 4ull * scale_cols + 8ull * topk + 4ull * weights +
           4ull * src_index + 4ull * heads;
  }
  friend constexpr bool operator==(const RowFormat&, const RowFormat&) = default;
};

inline constexpr uint64_t kAreaAlignment = 64;

PROXYEP_HOST_DEVICE constexpr uint64_t align_area(uint64_t bytes) {
  return (bytes + kAreaAlignment - 1) / kAreaAlignment * kAreaAlignment;
}

// Byte offsets of the arrays for `rows` rows of `format`, from the start of the data area.
struct RowAreas {
  uint64_t x = 0, scales = 0, topk_idx = 0, weights = 0, src_index = 0, heads = 0, end = 0;

  PROXYEP_HOST_DEVICE static constexpr RowAreas of(uint64_t rows, const RowFormat& f) {
    RowAreas a;
    a.x = 0;
    a.scales = align_area(a.x + rows * f.hidden_bytes);
    a.topk_idx = align_area(a.scales + rows * 4ull * f.scale_cols);
    a.weights = align_area(a.topk_idx + rows * 8ull * f.topk);
    a.src_index = align_area(a.weights + rows * 4ull * f.weights);
    a.heads = align_area(a.src_index + rows * 4ull * f.src_index);
    a.end = align_area(a.heads + rows * 4ull * f.heads);
    return a;
  }
  // An upper bound of `end` for `rows` rows, whatever split: what sizing checks use.
  PROXYEP_HOST_DEVICE static constexpr uint64_t bound(uint64_t rows, const RowFormat& f) {
    return rows * f.row_bytes() + 6 * kAreaAlignment;
  }
};

}  // namespace proxyep::gpu_side::ep
