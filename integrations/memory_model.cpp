#include "integrations/memory_model.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "integrations/buffer.hpp"
#include "integrations/session_sizes.hpp"
#include "proxy/session/arena_layout.hpp"

#include <fmt/format.h>

namespace proxyep::integrations {

std::vector<MemoryItem> buffer_memory(const MemoryShape& shape) {
  require(shape.ranks >= 1 && shape.ranks_per_node >= 1 && shape.tokens >= 1 && shape.hidden >= 8 &&
              shape.topk >= 1 && shape.experts >= 1,
          "buffer",
          "a memory shape needs positive ranks, ranks per node, tokens, hidden, top-k "
          "and experts");
  const int R = shape.ranks;
  const int64_t row = shape.hidden * 2;
  BufferOptions opts;
  opts.low_latency_mode = shape.low_latency;
  if (shape.low_latency) {
    opts.num_nvl_bytes = 0;
    opts.num_rdma_bytes = Buffer::get_low_latency_rdma_size_hint(
        static_cast<int>(shape.tokens), static_cast<int>(shape.hidden), R, shape.experts);
  } else {
    opts.num_nvl_bytes = Buffer::nvl_bytes_hint(shape.tokens, row, shape.topk, R);
    opts.num_rdma_bytes =
        R > shape.ranks_per_node
            ? Buffer::rdma_bytes_hint(shape.tokens, row, shape.topk, R, shape.ranks_per_node)
            : 0;
  }
  const proxy::SessionSizes sizes = session_sizes(opts, R, shape.ranks_per_node);
  const proxy::ArenaLayout layout(0, sizes);
  // The arena's areas where the layout puts them: records from 0, the stream words (one cache
  // line each, per source and receiver), the eager slots, then the data area on a page (the
  // rounding is counted with the eager slots).
  const uint64_t records = layout.published_word(0);
  const uint64_t words = layout.eager_slot(0, 0) - records;
  const uint64_t eager_in_arena = layout.data_base() - records - words;
  const uint64_t eager = 2 * static_cast<uint64_t>(R) * sizes.eager_bytes;
  std::vector<MemoryItem> items;
  items.push_back({"arena.records", records, true,
                   fmt::format("2 x R x record = 2 x {} x {} B", R, sizes.record_bytes)});
  items.push_back({"arena.words", words, true,
                   fmt::format("4 x R x {} B (a cache line each)", words / (4 * R))});
  items.push_back(
      {"arena.eager_slots", eager_in_arena, true,
       fmt::format("2 x R x {} = 2 x {} x {} B, page-aligned",
                   shape.low_latency ? "max(eager, LL slot = num_rdma_bytes / 2R)" : "eager", R,
                   sizes.eager_bytes)});
  if (sizes.data_bytes > 0)
    items.push_back({"arena.data", sizes.data_bytes, true,
                     fmt::format("num_nvl_bytes = nvl_bytes_hint(T={}, {} B, top-{}, R={})",
                                 shape.tokens, row, shape.topk, R)});
  // Staging exists when the group spans nodes (LL without NVLink: every peer is a node).
  if (const uint64_t staging = layout.staging_bytes(); staging > 0) {
    items.push_back({"staging.records", records, true,
                     fmt::format("2 x R x record = 2 x {} x {} B", R, sizes.record_bytes)});
    items.push_back({"staging.eager_slots", eager, true,
                     fmt::format("2 x R x eager = 2 x {} x {} B", R, sizes.eager_bytes)});
    if (staging > records + eager)
      items.push_back({"staging.data", staging - records - eager, true,
                       fmt::format("num_rdma_bytes = rdma_bytes_hint(T={}, {} B, top-{}, R={}, "
                                   "N={})",
                                   shape.tokens, row, shape.topk, R, shape.ranks_per_node)});
  }
  if (!shape.low_latency)
    items.push_back({"landing", static_cast<uint64_t>(params::ep_landing_bytes.get()), false,
                     "ep.landing_bytes of address space; a call touches its recv_x"});
  return items;
}

}  // namespace proxyep::integrations
