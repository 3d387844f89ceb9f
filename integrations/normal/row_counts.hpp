// RowCounts: how many rows every rank sends every rank in one call, the matrix a dispatch agrees
// on in its notify exchange and its handle keeps (as DeepEP's inclusive rank_prefix_matrix) for
// cached dispatches and the combine that returns the rows.
#pragma once

#include "integrations/normal/notify_record.hpp"
#include "integrations/normal_types.hpp"

#include <cstdint>
#include <vector>

namespace proxyep::integrations::normal {

class RowCounts {
 public:
  // From every rank's record of one call (rows_to of source s).
  static RowCounts from_records(const std::vector<NotifyRecord>& records);
  // What the dispatch that made `handle` moved.
  static RowCounts from_handle(const DispatchHandle& handle);

  int ranks() const { return ranks_; }
  // Rows rank s sends rank d.
  int64_t at(int s, int d) const { return counts_[static_cast<size_t>(s * ranks_ + d)]; }
  // Rows rank d receives in all.
  int64_t received_by(int d) const;
  // Where the rows from s start in d's receive order (by source rank, then token index).
  int64_t first_from(int s, int d) const;
  // The rows rank d sends to each rank (int64, for the stream plans).
  std::vector<int64_t> sent_by(int s) const;
  std::vector<int64_t> received_from_each(int d) const;
  // DeepEP's rank_prefix_matrix: i32 [R, R], [s][d] = rows ranks 0..s send to rank d.
  gpu_side::ep::Tensor prefix_matrix() const;

 private:
  explicit RowCounts(int ranks) : ranks_(ranks), counts_(static_cast<size_t>(ranks * ranks), 0) {}
  int ranks_;
  std::vector<int64_t> counts_;  // [s][d]
};

}  // namespace proxyep::integrations::normal
