// What a rank's Buffer holds in host memory, item by item, for a job's shape, without opening
// anything: the sizes the Buffer would open its session with (session_sizes.hpp) laid out as the
// session lays them out (proxy/session/arena_layout.hpp). `proxyep info --memory` prints it.
//
// Per rank, with R ranks, N per node, T tokens per rank, H bytes per token row:
//   arena      2R x record + 4R x 64 (words) + 2R x eager (page-aligned) + num_nvl_bytes
//              (a memfd its node peers map; the eager slots are touched only by eager calls)
//   staging    2R x record + 2R x eager + num_rdma_bytes (when the group spans nodes)
//   landing    ep.landing_bytes of address space; a call touches its recv_x there
//   fabric     the provider's own pools (measured, not computed: ~20 MiB per tcp rank with
//              fabric.rxm_buffer_bytes = 2048; EFA's are the provider's)
// record = the notify record of R ranks (grows with R); eager = ep.eager_bytes (normal) or the LL
// slot (low_latency_mode: num_rdma_bytes / 2R, DeepEP's LL buffer, O(R x T x H) like DeepEP's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace proxyep::integrations {

struct MemoryShape {
  int ranks = 2;
  int ranks_per_node = 1;
  int64_t tokens = 64;    // per rank (LL: num_max_dispatch_tokens_per_rank)
  int64_t hidden = 1024;  // BF16 elements per token
  int topk = 8;
  int experts = 64;
  bool low_latency = false;  // a low_latency_mode Buffer sized by the LL hint
};

struct MemoryItem {
  std::string name;      // "arena.eager_slots"
  uint64_t bytes = 0;    // per rank
  bool resident = true;  // false: address space a call touches only in part (landing)
  std::string formula;   // how it is computed, in the shape's terms
};

// One rank's items (rank 0 of the shape; every rank's are the same size). Throws
// proxyep::Error("buffer") for a shape no Buffer accepts.
std::vector<MemoryItem> buffer_memory(const MemoryShape& shape);

}  // namespace proxyep::integrations
