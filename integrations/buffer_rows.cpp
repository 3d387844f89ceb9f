#include "integrations/buffer_rows.hpp"

#include "gpu_side/ep/host_reduce.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

ep::RowInput row_input(const RowSource& source) {
  ep::RowInput in;
  in.x = static_cast<const std::byte*>(source.x.data);
  if (source.x_scales.defined()) {
    in.scales = source.x_scales.as<uint32_t>();
    in.scale_row_stride = source.x_scales.row_stride;
    in.scale_col_stride = source.x_scales.col_stride;
  }
  in.topk_idx = source.topk_idx.defined() ? source.topk_idx.as<int64_t>() : nullptr;
  in.topk_weights = source.topk_weights.defined() ? source.topk_weights.as<float>() : nullptr;
  in.format = source.format;
  in.shape = source.shape;
  return in;
}

void write_row(const RowSource& source, const RowSink& sink, int64_t row, int64_t t) {
  ep::dispatch_row(row_input(source), sink, row, t, ep::HostLanes{});
}

void combine_tokens(ep::HostExecutor& executor, const ep::CombineInput& input, int64_t num_tokens) {
  for_each_token_block(executor, num_tokens, [&](int64_t begin, int64_t end) {
    ep::reduce_tokens_host(input, begin, end);
  });
}

void copy_rows(ep::HostExecutor& executor, std::byte* to, const std::byte* from, int64_t rows,
               uint64_t row_bytes, int64_t rows_out) {
  if (rows > 0) {
    // Blocks of at least 256 KiB: copies smaller than that are not worth a hand-off.
    const uint64_t bytes = static_cast<uint64_t>(rows) * row_bytes;
    const int64_t blocks =
        std::clamp<int64_t>(static_cast<int64_t>(bytes >> 18), 1, int64_t{2} * executor.threads());
    const int64_t per_block = (rows + blocks - 1) / blocks;
    executor.run(blocks, [&](int64_t b) {
      int64_t begin = b * per_block, end = std::min(rows, begin + per_block);
      if (begin < end)
        std::memcpy(to + begin * row_bytes, from + begin * row_bytes,
                    static_cast<size_t>(end - begin) * row_bytes);
    });
  }
  if (rows_out > rows)
    std::memset(to + rows * row_bytes, 0, static_cast<size_t>(rows_out - rows) * row_bytes);
}

}  // namespace proxyep
