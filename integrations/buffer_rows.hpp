// The per-row work of dispatch's and combine's CPU twins: the rules themselves (what one row
// carries, how one token is reduced) live in gpu_side/ep/row_rules.hpp, shared with the CUDA
// kernels; this file adapts the Buffer's tensors to them and runs them on the host executor
// (token blocks for dispatch_row and combine_token, bulk row copies).
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/host_executor.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace proxyep {

// Where a row's arrays start at a destination (row_rules.hpp).
using gpu_side::ep::RowSink;

// The sender's rows, as the call passed them.
struct RowSource {
  gpu_side::ep::TensorRef x, x_scales, topk_idx, topk_weights;
  gpu_side::ep::RowFormat format;
  gpu_side::ep::EpShape shape;
};

// `source` as the raw pointers the shared rule reads.
gpu_side::ep::RowInput row_input(const RowSource& source);

// Writes token `t` of `source` as row first_row + `row` of `sink` (ep::dispatch_row on one host
// lane).
void write_row(const RowSource& source, const RowSink& sink, int64_t row, int64_t t);

// body(begin, end) over token ranges covering [0, tokens), run on the executor.
template <typename Body>
void for_each_token_block(gpu_side::ep::HostExecutor& executor, int64_t tokens, Body&& body) {
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

// Combine's reduce on the host: what ep::combine_token gives for tokens [0, num_tokens), computed
// by ep::reduce_tokens_host (host_reduce.hpp: the same bits, vectorised) in token blocks on the
// executor (tokens are independent, so the split does not change a bit).
void combine_tokens(gpu_side::ep::HostExecutor& executor, const gpu_side::ep::CombineInput& input,
                    int64_t num_tokens);

// Copies `rows` rows of `row_bytes` from `from` to `to`, zero-filling up to `rows_out` rows.
void copy_rows(gpu_side::ep::HostExecutor& executor, std::byte* to, const std::byte* from,
               int64_t rows, uint64_t row_bytes, int64_t rows_out);

}  // namespace proxyep
