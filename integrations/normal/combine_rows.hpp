// The rows of a combine: every rank returns each row it received to the row's source, in
// receive order (the rows from one source are contiguous there); the source keeps, for each
// rank, where that rank's rows for its tokens are: in place in the slots when they came as one
// chunk, or as several that all fit the stream's window (no chunk of this call then reuses a
// slot, and the next call's chunks wait for this rank's next record), else gathered here.
// Weights of chunked streams are always gathered (a few floats per row).
#pragma once

#include "integrations/backend/row_backend.hpp"
#include "integrations/normal/row_counts.hpp"
#include "integrations/normal/streams.hpp"

#include <vector>

namespace proxyep::integrations::normal {

class CombineStreams : public RowStreams {
 public:
  // `x` [num_recv, hidden] and `weights` (f32 [num_recv, topk] or null): the rows to return.
  // `x_on_device`: the fabric cannot read x (caller_rows offers none).
  CombineStreams(RowBackend& backend, const gpu_side::ep::RowFormat& format,
                 const RowCounts& counts, const std::byte* x, const float* weights, int topk,
                 int me, bool x_on_device);

  void fill(int destination, uint64_t first, uint64_t rows, std::byte* slot) override;
  void take(int source, uint64_t chunk, uint64_t first, uint64_t rows,
            const std::byte* slot) override;
  // Without weights a chunk is x's rows as they are (the rows for a source are contiguous); x
  // in device memory is never offered (FI_HMEM registration is not built yet).
  const std::byte* caller_rows(int destination, uint64_t first, uint64_t rows) const override;

  // Each rank's block of rows for this rank's tokens (this rank's own: in x), for the reduce.
  const std::vector<const uint16_t*>& block_rows() const { return block_rows_; }
  const std::vector<const float*>& block_weights() const { return block_weights_; }
  // CombineInput::block_chunks / block_chunk_rows (0: the rank's block is contiguous).
  const std::vector<const uint16_t* const*>& block_chunks() const { return block_chunks_; }
  const std::vector<int64_t>& block_chunk_rows() const { return block_chunk_rows_; }
  // Chunks left where they landed for the reduce (BufferStats::chunks_reduced_in_place).
  uint64_t chunks_in_place() const { return chunks_in_place_; }

 protected:  // hier_combine_rows.hpp reduces with them
  const RowCounts& counts_;
  const std::byte* x_;
  const float* weights_;
  int topk_, me_;
  bool x_on_device_;
  uint64_t row_bytes_;
  std::vector<const uint16_t*> block_rows_;
  std::vector<const float*> block_weights_;
  std::vector<gpu_side::ep::Tensor> gathered_x_,
      gathered_weights_;                               // by rank, when it sent several chunks
  std::vector<std::vector<const uint16_t*>> chunk_x_;  // by rank: each chunk's rows in its slot
  std::vector<const uint16_t* const*> block_chunks_;
  std::vector<int64_t> block_chunk_rows_;
  uint64_t chunks_in_place_ = 0;
};

}  // namespace proxyep::integrations::normal
