// proxyep::Config: DeepEP V1's deep_ep.Config (DEEPEP_CONTRACT 1.5): the chunking knobs, their
// invariants, the default tables per rank count and the buffer size hints. The tables are
// DeepEP's, unchanged, so callers that pass configs tuned for DeepEP keep working. What a call
// reads of its Config: the RDMA chunk sizes, as DeepEP's internode kernels do, on its streams to
// other nodes (chunks of at most num_max_rdma_chunked_send_tokens rows, at most
// num_max_rdma_chunked_recv_tokens rows in flight; the Buffer's slots bound both:
// integrations/normal/chunk_plan.hpp's FabricChunking). The rest (num_sms, the NVL sizes) is
// accepted and checked but not read: inside a node, chunks follow from the Buffer's memory,
// ep.chunk_bytes and ep.eager_bytes. The hints size a Buffer as DeepEP would (smaller than
// nvl_bytes_hint's whole calls: calls stream).
#pragma once

#include <cstdint>

namespace proxyep {

struct Config {
  int num_sms = 20;
  int num_max_nvl_chunked_send_tokens = 6;
  int num_max_nvl_chunked_recv_tokens = 256;
  int num_max_rdma_chunked_send_tokens = 6;
  int num_max_rdma_chunked_recv_tokens = 256;

  // Checks DeepEP's constructor invariants (num_sms >= 0; 0 < nvl_send < nvl_recv; rdma > 0;
  // rdma_recv rounded up to a multiple of rdma_send; rdma_send <= rdma_recv / 2) and applies the
  // rounding. Throws proxyep::Error("config", ...).
  static Config make(int num_sms = 20, int nvl_send = 6, int nvl_recv = 256, int rdma_send = 6,
                     int rdma_recv = 256);
  int channels() const { return num_sms / 2; }

  // DeepEP's size hints (bytes, multiples of 128), for callers that size a Buffer like DeepEP.
  int64_t get_nvl_buffer_size_hint(int64_t hidden_bytes, int num_ranks) const;
  int64_t get_rdma_buffer_size_hint(int64_t hidden_bytes, int num_ranks) const;
};

// Buffer.num_sms, class-wide (default 20); set_num_sms requires an even, positive value.
int get_num_sms();
void set_num_sms(int num_sms);

// The default tables (DEEPEP_CONTRACT 1.5, pre-V2 main values), with num_sms = get_num_sms().
// Throws proxyep::Error("config") for a rank count not in the table.
Config get_dispatch_config(int num_ranks);
Config get_combine_config(int num_ranks);

}  // namespace proxyep
