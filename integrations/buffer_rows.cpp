#include "integrations/buffer_rows.hpp"

namespace proxyep {

RowSink RowSink::at(std::byte* area, const ep::RowAreas& a, int64_t first_row, int rank) {
  RowSink sink;
  sink.x = area + a.x;
  sink.scales = reinterpret_cast<uint32_t*>(area + a.scales);
  sink.topk_idx = reinterpret_cast<int64_t*>(area + a.topk_idx);
  sink.weights = reinterpret_cast<float*>(area + a.weights);
  sink.src_index = reinterpret_cast<int32_t*>(area + a.src_index);
  sink.first_row = first_row;
  sink.rank = rank;
  return sink;
}

void write_row(const RowSource& source, const RowSink& sink, int64_t row, int64_t t) {
  const ep::RowFormat& f = source.format;
  const int64_t r = sink.first_row + row;
  std::memcpy(sink.x + r * f.hidden_bytes,
              static_cast<const std::byte*>(source.x.data) + t * f.hidden_bytes, f.hidden_bytes);
  // Scales are 4-byte words (float32, or int32 UE8M0): copied as bits, strides honoured.
  for (uint32_t c = 0; c < f.scale_cols; ++c)
    sink.scales[r * f.scale_cols + c] = source.x_scales.at<uint32_t>(t, c);
  if (f.topk > 0) {
    const auto* idx = source.topk_idx.as<int64_t>() + t * f.topk;
    const float* w = f.weights > 0 ? source.topk_weights.as<float>() + t * f.topk : nullptr;
    for (uint32_t k = 0; k < f.topk; ++k) {
      int64_t local = source.shape.local_expert(idx[k], sink.rank);
      sink.topk_idx[r * f.topk + k] = local;
      if (w != nullptr) sink.weights[r * f.topk + k] = local >= 0 ? w[k] : 0.0f;
    }
  }
  if (f.src_index > 0) sink.src_index[r] = static_cast<int32_t>(t);
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
