// The rows of a dispatch: where each of this rank's tokens goes (TokenRouting), and the streams
// that carry them (DispatchStreams: which tokens fill a chunk for a destination, and where the
// rows of an arriving chunk go in the outputs).
#pragma once

#include "integrations/backend/row_backend.hpp"
#include "integrations/normal/dispatch_args.hpp"
#include "integrations/normal/streams.hpp"
#include "integrations/normal_types.hpp"

#include <cstdint>
#include <vector>

namespace proxyep::integrations::normal {

struct TokenRouting {
  gpu_side::ep::Tensor in_rank;  // bool [N, R] (the handle keeps it)
  gpu_side::ep::Tensor
      send_head;  // i32 [N, R]: the token's position among the rows to each rank, or -1
  std::vector<int64_t> rows_to;                 // [R]
  std::vector<std::vector<int32_t>> tokens_to;  // by destination (not this rank): in row order

  // From the layout's is_token_in_rank (rows to a rank are in token order).
  static TokenRouting fresh(const gpu_side::ep::TensorRef& is_token_in_rank, int ranks, int me);
  // Replays the routing of the dispatch that made `handle`.
  static TokenRouting cached(const DispatchHandle& handle, int me);

  TokenRoutes routes() const;

 private:
  // tokens_to from in_rank, send_head and rows_to.
  void gather_tokens(int me);
};

class DispatchStreams : public RowStreams {
 public:
  // `on_device`: the backend's kernels cannot write peers' landing regions (not registered with
  // the device: they are mostly unused address space); rows stored there go through the slot.
  DispatchStreams(RowBackend& backend, const DispatchInput& input, const DispatchArgs& args,
                  const TokenRouting& routing, const gpu_side::ep::EpShape& shape, int me,
                  bool on_device);

  // The outputs the arriving rows go to; rows from source s start at row first_row[s].
  void receive_into(DispatchResult& out, std::vector<int64_t> first_row);
  // Rows stored straight into the receivers' recv_x (landing_zone.hpp): x_to[d] is where this
  // rank's rows start in node peer d's (null: not stored there by this rank), landing_at[d]
  // where they start in fabric peer d's landing region (-1: not written there); x_from[s] says
  // rank s puts its rows' token bytes straight into this rank's recv_x (its chunks carry the
  // rest of each row).
  void store_in_place(std::vector<std::byte*> x_to, std::vector<int64_t> landing_at,
                      std::vector<char> x_from);
  int64_t landing_offset(int destination, uint64_t first) const override;
  // Rows this rank stored straight into a node peer's recv_x.
  uint64_t rows_in_place() const { return rows_in_place_; }

  void fill(int destination, uint64_t first, uint64_t rows, std::byte* slot) override;
  void take(int source, uint64_t chunk, uint64_t first, uint64_t rows,
            const std::byte* slot) override;
  // This rank's rows to itself, straight into the outputs.
  void local() override;

 protected:  // hier_dispatch_rows.hpp forwards with them
  // This rank's outputs as rows from `first_row` on.
  gpu_side::ep::RowSink output_sink(int64_t first_row) const;

  const DispatchInput& input_;
  const TokenRouting& routing_;
  RowSource source_;
  int me_;
  bool on_device_;
  DispatchResult* out_ = nullptr;
  std::vector<int64_t> first_row_;
  std::vector<std::byte*> x_to_;     // by destination; empty: none in place
  std::vector<int64_t> landing_at_;  // by destination; empty: none in place
  std::vector<char> x_from_;         // by source; empty: none in place
  uint64_t rows_in_place_ = 0;
};

}  // namespace proxyep::integrations::normal
