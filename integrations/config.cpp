// DeepEP's Config: invariants, default tables and size hints (DEEPEP_CONTRACT 1.5, 3.4). The
// tables are data, one row per supported rank count, and the hints are written term by term
// after the buffer regions they reserve so a reader can check them against the document.
#include "integrations/config.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>

namespace proxyep {

namespace {

constexpr std::string_view kPhase = "config";

// DeepEP's fixed NVLink domain size (NUM_MAX_NVL_PEERS); the hints are DeepEP's formulas, so
// they use it rather than ProxyEP's configurable ranks_per_node.
constexpr int64_t kNvlPeers = 8;
// Per-token reservations of the hints: room for up to 128 top-k entries and 128 scales.
constexpr int64_t kMaxTopk = 128;
constexpr int64_t kMaxScales = 128;
constexpr int64_t kSourceMetaBytes = 8;      // internode SourceMeta: source RDMA rank + NVL mask
constexpr int64_t kRdmaTokenTailBytes = 16;  // one int4 per token in the RDMA channel
constexpr int64_t kHintAlignment = 128;

struct Chunking {
  int nvl_send, nvl_recv, rdma_send, rdma_recv;
};

struct TableRow {
  int ranks;
  Chunking dispatch, combine;
};

// DEEPEP_CONTRACT 1.5, "pre-V2 main & HEAD" columns.
constexpr std::array<TableRow, 12> kDefaults{{
    {2, {24, 256, 6, 128}, {10, 256, 6, 128}},
    {4, {6, 256, 6, 128}, {9, 256, 6, 128}},
    {8, {6, 256, 6, 128}, {4, 256, 6, 128}},
    {16, {36, 288, 20, 128}, {4, 288, 12, 128}},
    {24, {32, 288, 8, 128}, {1, 288, 8, 128}},
    {32, {32, 288, 8, 128}, {1, 288, 8, 128}},
    {48, {32, 288, 8, 128}, {1, 288, 8, 128}},
    {64, {32, 288, 8, 128}, {1, 288, 8, 128}},
    {96, {20, 480, 12, 128}, {1, 480, 8, 128}},
    {128, {20, 560, 12, 128}, {1, 560, 8, 128}},
    {144, {32, 720, 12, 128}, {2, 720, 8, 128}},
    {160, {28, 720, 12, 128}, {2, 720, 8, 128}},
}};

std::atomic<int> g_num_sms{20};

const TableRow& table_row(int num_ranks) {
  for (const TableRow& row : kDefaults)
    if (row.ranks == num_ranks) return row;
  fail(std::string(kPhase),
       "no default config for {} ranks; supported: 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, "
       "160 (pass a Config explicitly)",
       num_ranks);
}

Config from_chunking(const Chunking& c) {
  return Config::make(get_num_sms(), c.nvl_send, c.nvl_recv, c.rdma_send, c.rdma_recv);
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// DeepEP's shape assertions of the hints: one NVLink domain, or whole 8-rank nodes.
void check_hint_args(int64_t hidden_bytes, int num_ranks, int num_sms) {
  require(hidden_bytes > 0, kPhase, "hidden_bytes must be positive; got {}", hidden_bytes);
  require(num_ranks >= 1, kPhase, "num_ranks must be positive; got {}", num_ranks);
  require(num_ranks <= kNvlPeers || num_ranks % kNvlPeers == 0, kPhase,
          "num_ranks ({}) must be at most {} or a multiple of {}", num_ranks, kNvlPeers, kNvlPeers);
  require(num_ranks <= kNvlPeers || num_sms % 2 == 0, kPhase,
          "num_sms ({}) must be even for internode ranks", num_sms);
}

}  // namespace

Config Config::make(int num_sms, int nvl_send, int nvl_recv, int rdma_send, int rdma_recv) {
  require(num_sms >= 0, kPhase, "num_sms must be >= 0; got {}", num_sms);
  require(nvl_send > 0 && nvl_recv > 0, kPhase,
          "num_max_nvl_chunked_send/recv_tokens must be positive; got {}, {}", nvl_send, nvl_recv);
  require(nvl_send < nvl_recv, kPhase,
          "num_max_nvl_chunked_send_tokens ({}) must be less than "
          "num_max_nvl_chunked_recv_tokens ({})",
          nvl_send, nvl_recv);
  require(rdma_send > 0 && rdma_recv > 0, kPhase,
          "num_max_rdma_chunked_send/recv_tokens must be positive; got {}, {}", rdma_send,
          rdma_recv);
  // DeepEP rounds the receive ring up to whole send chunks before checking it.
  const int rounded = static_cast<int>(round_up(rdma_recv, rdma_send));
  require(rdma_send < rounded, kPhase,
          "num_max_rdma_chunked_send_tokens ({}) must be less than "
          "num_max_rdma_chunked_recv_tokens ({}, rounded up to a multiple of the send size)",
          rdma_send, rounded);
  // Senders update the remote head lazily, so the ring must hold two send chunks.
  require(rdma_send <= rounded / 2, kPhase,
          "num_max_rdma_chunked_send_tokens ({}) must be at most half of "
          "num_max_rdma_chunked_recv_tokens ({})",
          rdma_send, rounded);
  Config config;
  config.num_sms = num_sms;
  config.num_max_nvl_chunked_send_tokens = nvl_send;
  config.num_max_nvl_chunked_recv_tokens = nvl_recv;
  config.num_max_rdma_chunked_send_tokens = rdma_send;
  config.num_max_rdma_chunked_recv_tokens = rounded;
  return config;
}

int64_t Config::get_nvl_buffer_size_hint(int64_t hidden_bytes, int num_ranks) const {
  check_hint_args(hidden_bytes, num_ranks, num_sms);
  const int64_t rdma_ranks = std::max<int64_t>(1, num_ranks / kNvlPeers);
  const int64_t nvl_ranks = std::min<int64_t>(num_ranks, kNvlPeers);
  // Per (channel, NVL peer): the channel's start/end and head/tail ints, then a receive ring of
  // nvl_recv tokens, each with its data, source meta, top-k indices, weights and scales.
  const int64_t meta_bytes = (2 * rdma_ranks + 3) * int64_t{sizeof(int)};
  const int64_t token_bytes =
      hidden_bytes + kSourceMetaBytes + kMaxTopk * 8 + kMaxTopk * 4 + kMaxScales * 4;
  const int64_t bytes =
      channels() * nvl_ranks * (meta_bytes + num_max_nvl_chunked_recv_tokens * token_bytes);
  return round_up(bytes, kHintAlignment);
}

int64_t Config::get_rdma_buffer_size_hint(int64_t hidden_bytes, int num_ranks) const {
  check_hint_args(hidden_bytes, num_ranks, num_sms);
  if (num_ranks <= kNvlPeers) return 0;  // one node: no RDMA buffer
  const int64_t rdma_ranks = num_ranks / kNvlPeers;
  // Per (channel, RDMA peer), once for the send half and once for the receive half: the
  // per-NVL-peer prefix ints plus head/tail, then a ring of rdma_recv tokens (data, source meta,
  // top-k indices, weights, scales and one int4 tail).
  const int64_t meta_bytes = (2 * kNvlPeers + 2) * int64_t{sizeof(int)};
  const int64_t token_bytes = hidden_bytes + kSourceMetaBytes + kMaxTopk * 8 + kMaxTopk * 4 +
                              kMaxScales * 4 + kRdmaTokenTailBytes;
  const int64_t bytes =
      channels() * rdma_ranks * (meta_bytes + num_max_rdma_chunked_recv_tokens * token_bytes) * 2;
  return round_up(bytes, kHintAlignment);
}

int get_num_sms() {
  return g_num_sms.load(std::memory_order_relaxed);
}

void set_num_sms(int num_sms) {
  require(num_sms > 0 && num_sms % 2 == 0, kPhase,
          "num_sms must be even and positive (two SMs per channel); got {}", num_sms);
  // Relaxed: a plain setting read by later calls, publishing nothing else.
  g_num_sms.store(num_sms, std::memory_order_relaxed);
}

Config get_dispatch_config(int num_ranks) {
  return from_chunking(table_row(num_ranks).dispatch);
}

Config get_combine_config(int num_ranks) {
  return from_chunking(table_row(num_ranks).combine);
}

}  // namespace proxyep
