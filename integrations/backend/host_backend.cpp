// The host backend (host_backend.hpp).
#include "integrations/backend/host_backend.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/ep/host_reduce.hpp"
#include "gpu_side/ep/ll_counted.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

int HostBackend::default_threads(int ranks_per_node) {
  int64_t configured = params::ep_host_threads.get();
  if (configured > 0) return static_cast<int>(std::min<int64_t>(configured, 64));
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  int share = static_cast<int>(std::max<long>(1, cores / std::max(1, ranks_per_node)));
  return std::min(share, 8);
}

template <typename Body>
void HostBackend::for_each_token_block(int64_t tokens, Body&& body) {
  if (tokens <= 0) return;
  // A few blocks per thread balance uneven rows without paying much per block.
  const int64_t blocks = std::min<int64_t>(tokens, int64_t{4} * executor_.threads());
  const int64_t per_block = (tokens + blocks - 1) / blocks;
  executor_.run(blocks, [&](int64_t b) {
    int64_t begin = b * per_block;
    int64_t end = std::min(tokens, begin + per_block);
    if (begin < end) body(begin, end);
  });
}

ep::Tensor HostBackend::allocate(ep::DType dtype, int64_t rows, int64_t cols) {
  return ep::Tensor::empty(dtype, rows, cols);
}

ep::Tensor HostBackend::allocate(ep::DType dtype, int64_t rows) {
  return ep::Tensor::empty(dtype, rows);
}

ep::DispatchLayout HostBackend::layout(const ep::TensorRef& topk_idx, const ep::EpShape& shape) {
  return ep::compute_dispatch_layout(topk_idx, shape, &executor_);
}

void HostBackend::pack_rows(const RowSource& source, const ep::RowSink& sink,
                            std::span<const int32_t> tokens) {
  const ep::RowInput in = row_input(source);
  for_each_token_block(static_cast<int64_t>(tokens.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      ep::dispatch_row(in, sink, i, tokens[static_cast<size_t>(i)], ep::HostLanes{});
  });
}

void HostBackend::place_routed_rows(const RowSource& source, const ep::RowSink& sink,
                                    const TokenRoutes& routes) {
  const ep::RowInput in = row_input(source);
  const int R = routes.ranks, d = sink.rank;
  for_each_token_block(routes.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      if (routes.in_rank[t * R + d])
        ep::dispatch_row(in, sink, routes.send_head[t * R + d], t, ep::HostLanes{});
  });
}

void HostBackend::copy_runs(std::span<const ep::CopyRun> runs) {
  // Pieces of at least 256 KiB, about two per executor thread: smaller copies are not worth a
  // hand-off, so a small batch runs on this thread.
  constexpr uint64_t kMinPiece = uint64_t{1} << 18;
  uint64_t total = 0;
  for (const ep::CopyRun& run : runs)
    total += run.bytes;
  if (total < kMinPiece) {
    for (const ep::CopyRun& run : runs)
      if (run.bytes > 0) std::memcpy(run.to, run.from, run.bytes);
    return;
  }
  const auto share = static_cast<uint64_t>(2 * executor_.threads());
  const uint64_t piece = std::max(kMinPiece, (total + share - 1) / share);
  struct Piece {
    const ep::CopyRun* run;
    uint64_t at, bytes;
  };
  std::vector<Piece> pieces;
  for (const ep::CopyRun& run : runs)
    for (uint64_t at = 0; at < run.bytes; at += piece)
      pieces.push_back({&run, at, std::min(piece, run.bytes - at)});
  executor_.run(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& p = pieces[static_cast<size_t>(i)];
    std::memcpy(p.run->to + p.at, p.run->from + p.at, p.bytes);
  });
}

void HostBackend::copy_rows(std::byte* to, const std::byte* from, int64_t rows,
                            uint64_t row_bytes) {
  if (rows <= 0) return;
  const ep::CopyRun run{.to = to, .from = from, .bytes = static_cast<uint64_t>(rows) * row_bytes};
  copy_runs({&run, 1});
}

void HostBackend::fill(std::byte* to, uint8_t value, uint64_t bytes) {
  std::memset(to, value, static_cast<size_t>(bytes));
}

void HostBackend::reduce(const ep::CombineInput& input, int64_t num_tokens) {
  // Tokens are independent, so the split into blocks does not change a bit.
  for_each_token_block(
      num_tokens, [&](int64_t begin, int64_t end) { ep::reduce_tokens_host(input, begin, end); });
}

void HostBackend::write(std::byte* to, const void* from, uint64_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

template <typename T>
void HostBackend::add_values(const ep::TensorRef& to, std::span<const T> values) {
  require(to.rows >= static_cast<int64_t>(values.size()), "host backend", "{} values added to {}",
          values.size(), to);
  for (size_t i = 0; i < values.size(); ++i)
    const_cast<T&>(to.at<T>(static_cast<int64_t>(i), 0)) += values[i];  // the caller's to write
}

void HostBackend::add(const ep::TensorRef& to, std::span<const int32_t> values) {
  add_values(to, values);
}

void HostBackend::add(const ep::TensorRef& to, std::span<const int64_t> values) {
  add_values(to, values);
}

void HostBackend::ll_pack(const ep::LlFormat& format, const ep::TensorRef& x,
                          std::span<const ep::LlPackItem> items) {
  // A token goes to up to topk ranks: it is cast once (the FP8 cast is the costly part), into
  // its first item's message, and that message copied to the others.
  require_ll_tokens(items, x.rows);
  std::vector<int64_t> first(static_cast<size_t>(x.rows), -1);  // by token: its first item
  std::vector<size_t> casts, copies;
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t& at = first[static_cast<size_t>(items[i].token)];
    if (at < 0) {
      at = static_cast<int64_t>(i);
      casts.push_back(i);
    } else {
      copies.push_back(i);
    }
  }
  const auto* rows = x.as<uint16_t>();
  for_each_token_block(static_cast<int64_t>(casts.size()), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const ep::LlPackItem& item = items[casts[static_cast<size_t>(c)]];
      ep::ll_pack_message(format, rows + static_cast<int64_t>(item.token) * format.hidden,
                          item.token, item.message, ep::HostLanes{});
    }
  });
  const uint64_t message = format.message_bytes();
  for_each_token_block(static_cast<int64_t>(copies.size()), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const ep::LlPackItem& item = items[copies[static_cast<size_t>(c)]];
      std::memcpy(item.message,
                  items[static_cast<size_t>(first[static_cast<size_t>(item.token)])].message,
                  message);
    }
  });
}

void HostBackend::ll_unpack_counted(const ep::LlFormat& format, std::span<const int32_t> counts,
                                    std::span<const std::byte* const> from,
                                    std::span<const ep::LlExpertSink> sinks,
                                    int64_t rows_per_expert, int32_t* recv_count,
                                    int64_t* layout_range) {
  const ep::LlUnpackCountedParams p{.format = format,
                                    .counts = counts.data(),
                                    .from = from.data(),
                                    .sinks = sinks.data(),
                                    .recv_count = recv_count,
                                    .layout_range = layout_range,
                                    .ranks = static_cast<int32_t>(from.size()),
                                    .local_experts = static_cast<int32_t>(sinks.size()),
                                    .rows_per_expert = rows_per_expert};
  const char* error = ep::ll_unpack_counted_error(p);
  require(error == nullptr, "low_latency_dispatch", "ll_unpack_counted: {}",
          error != nullptr ? error : "");
  // A pair of (expert, source) per item, as the kernel's blocks take them.
  for_each_token_block(static_cast<int64_t>(sinks.size() * from.size()),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t q = begin; q < end; ++q)
                           ep::ll_unpack_counted_pair(p, q, ep::HostLanes{});
                       });
}

void HostBackend::ll_combine(std::span<const uint16_t* const> rows, const float* weights,
                             uint16_t* out, int topk, uint32_t hidden) {
  const int64_t tokens = ll_combine_tokens(rows, topk);
  for_each_token_block(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      ep::ll_combine_token(rows.data() + t * topk, weights + t * topk, topk, hidden,
                           out + t * hidden, ep::HostLanes{});
  });
}

}  // namespace proxyep::integrations
