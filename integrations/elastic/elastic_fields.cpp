// DeepEP V2's EPHandle fields (elastic_fields.hpp).
#include "integrations/elastic/elastic_fields.hpp"

#include "common/error.hpp"

#include <algorithm>

namespace proxyep::integrations::elastic {

namespace {
constexpr const char* kPhase = "dispatch";
}

std::vector<int32_t> psum_per_scaleup_rank(std::span<const int64_t> received_from_each,
                                           int num_scaleup_ranks) {
  require(num_scaleup_ranks >= 1 && received_from_each.size() % num_scaleup_ranks == 0, kPhase,
          "{} ranks do not split into scale-up domains of {}", received_from_each.size(),
          num_scaleup_ranks);
  std::vector<int32_t> psum(static_cast<size_t>(num_scaleup_ranks), 0);
  for (size_t s = 0; s < received_from_each.size(); ++s)
    psum[s % psum.size()] += static_cast<int32_t>(received_from_each[s]);
  for (size_t p = 1; p < psum.size(); ++p)
    psum[p] += psum[p - 1];
  return psum;
}

std::vector<int32_t> aligned_psum(std::span<const int> unaligned, int alignment) {
  require(alignment >= 1, kPhase, "expert_alignment must be >= 1; got {}", alignment);
  std::vector<int32_t> psum(unaligned.size());
  int32_t total = 0;
  for (size_t e = 0; e < unaligned.size(); ++e) {
    total += (unaligned[e] + alignment - 1) / alignment * alignment;
    psum[e] = total;
  }
  return psum;
}

void send_slots(const Routing& routing, const int64_t* topk_idx, const int32_t* send_head,
                int64_t tokens, int32_t* out) {
  const int K = routing.topk;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t* lanes = topk_idx + t * K;
    for (int k = 0; k < K; ++k) {
      int32_t slot = -1;
      if (lanes[k] >= 0) {
        const int64_t rank = lanes[k] / routing.local_experts;
        const bool repeated = std::any_of(lanes, lanes + k, [&](int64_t e) {
          return e >= 0 && e / routing.local_experts == rank;
        });
        if (!repeated) slot = send_head[t * routing.ranks + rank];
      }
      out[t * K + k] = slot;
    }
  }
}

void source_metadata(const Routing& routing, std::span<const int64_t> received_from_each,
                     const int32_t* recv_src_idx, const int64_t* recv_topk_idx,
                     int64_t num_max_tokens_per_rank, int64_t rows, int32_t* out) {
  const int K = routing.topk, cols = K + 2;
  int64_t row = 0;
  for (size_t src = 0; src < received_from_each.size(); ++src) {
    for (int64_t i = 0; i < received_from_each[src]; ++i, ++row) {
      require(row < rows, kPhase, "received rows exceed the {} of recv_src_metadata", rows);
      int32_t* meta = out + row * cols;
      const int64_t* lanes = recv_topk_idx + row * K;
      // Every received row has a local lane (that is why it came); 0 if a caller's table says
      // otherwise, as DeepEP's column is internal anyway.
      const int first = static_cast<int>(
          std::find_if(lanes, lanes + K, [](int64_t e) { return e >= 0; }) - lanes);
      meta[0] = static_cast<int32_t>(static_cast<int64_t>(src) * num_max_tokens_per_rank +
                                     recv_src_idx[row]);
      meta[1] = static_cast<int32_t>(static_cast<int64_t>(src) * K + (first < K ? first : 0));
      std::fill(meta + 2, meta + cols, -1);
    }
  }
  std::fill(out + row * cols, out + rows * cols, -1);
}

}  // namespace proxyep::integrations::elastic
