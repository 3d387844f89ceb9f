// The per-call row count matrix (row_counts.hpp).
#include "integrations/normal/row_counts.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

RowCounts RowCounts::from_records(const std::vector<NotifyRecord>& records) {
  const int R = static_cast<int>(records.size());
  RowCounts c(R);
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d)
      c.counts_[static_cast<size_t>(s * R + d)] = records[s].rows_to[d];
  return c;
}

RowCounts RowCounts::from_handle(const DispatchHandle& handle) {
  const auto R = static_cast<int>(handle.rank_prefix_matrix.rows());
  const auto* prefix = handle.rank_prefix_matrix.data<int32_t>();
  RowCounts c(R);
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d)
      c.counts_[static_cast<size_t>(s * R + d)] =
          prefix[s * R + d] - (s > 0 ? prefix[(s - 1) * R + d] : 0);
  return c;
}

int64_t RowCounts::received_by(int d) const {
  int64_t total = 0;
  for (int s = 0; s < ranks_; ++s)
    total += at(s, d);
  return total;
}

int64_t RowCounts::first_from(int s, int d) const {
  int64_t first = 0;
  for (int before = 0; before < s; ++before)
    first += at(before, d);
  return first;
}

std::vector<int64_t> RowCounts::sent_by(int s) const {
  std::vector<int64_t> out(static_cast<size_t>(ranks_));
  for (int d = 0; d < ranks_; ++d)
    out[d] = at(s, d);
  return out;
}

std::vector<int64_t> RowCounts::received_from_each(int d) const {
  std::vector<int64_t> out(static_cast<size_t>(ranks_));
  for (int s = 0; s < ranks_; ++s)
    out[s] = at(s, d);
  return out;
}

ep::Tensor RowCounts::prefix_matrix() const {
  auto t = ep::Tensor::empty(ep::DType::i32, ranks_, ranks_);
  auto* prefix = t.data<int32_t>();
  for (int s = 0; s < ranks_; ++s)
    for (int d = 0; d < ranks_; ++d)
      prefix[s * ranks_ + d] =
          static_cast<int32_t>(at(s, d) + (s > 0 ? prefix[(s - 1) * ranks_ + d] : 0));
  return t;
}

}  // namespace proxyep::integrations::normal
