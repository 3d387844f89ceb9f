// The per-row work of dispatch's CPU twin: where a row's arrays start at a destination
// (RowSink), what one row carries (write_row: token bytes, scales, top-k rewritten to the
// destination's local expert ids with -1 and zero weights elsewhere, source token index), and
// the executor loops over token blocks and row copies.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/host_executor.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace proxyep {

// The sender's rows, as the call passed them.
struct RowSource {
  ep::TensorRef x, x_scales, topk_idx, topk_weights;
  ep::RowFormat format;
  ep::EpShape shape;
};

// Row 0 of every array for one destination (already offset to the sender's first row there).
struct RowSink {
  std::byte* x = nullptr;
  uint32_t* scales = nullptr;
  int64_t* topk_idx = nullptr;
  float* weights = nullptr;
  int32_t* src_index = nullptr;
  int64_t first_row = 0;  // the sender's first row in these arrays
  int rank = 0;           // the destination (its experts are the local ones)

  static RowSink at(std::byte* area, const ep::RowAreas& a, int64_t first_row, int rank);
};

// Writes token `t` of `source` as row first_row + `row` of `sink`.
void write_row(const RowSource& source, const RowSink& sink, int64_t row, int64_t t);

// body(begin, end) over token ranges covering [0, tokens), run on the executor.
template <typename Body>
void for_each_token_block(ep::HostExecutor& executor, int64_t tokens, Body&& body) {
  if (tokens <= 0) return;
  // A few blocks per thread balance uneven rows without paying much per block.
  const int64_t blocks = std::min<int64_t>(tokens, int64_t{4} * executor.threads());
  const int64_t per_block = (tokens + blocks - 1) / blocks;
  executor.run(blocks, [&](int64_t b) {
    int64_t begin = b * per_block;
    int64_t end = std::min(tokens, begin + per_block);
    if (begin < end) body(begin, end);
  });
}

// Copies `rows` rows of `row_bytes` from `from` to `to`, zero-filling up to `rows_out` rows.
void copy_rows(ep::HostExecutor& executor, std::byte* to, const std::byte* from, int64_t rows,
               uint64_t row_bytes, int64_t rows_out);

}  // namespace proxyep
