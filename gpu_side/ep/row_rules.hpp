// The per-row rules of normal-mode dispatch and combine (DEEPEP_CONTRACT 2.3, 2.5), written once
// for the CPU twins (integrations/buffer_rows.cpp, buffer_combine.cpp) and the CUDA kernels
// (gpu_side/cuda/ep_dispatch.cu, ep_combine.cu), so the two produce the same bytes:
//
// - dispatch_row: one token of the sender becomes one row at a destination: the token bytes, the
//   4-byte FP8 scales (strides honoured, so column-major scales work), the top-k indices
//   rewritten to the destination's local expert ids (-1 where another rank owns the expert) with
//   the weights zeroed there, and the source token index. Hierarchical internode moves a token
//   in two steps with the same rule: to the forwarder on the destination node as a row that
//   keeps the global expert ids and weights (RowSink::rank < 0) and carries its heads; from
//   there to each destination rank as that rank's row, the source token index passed through
//   (RowInput::src_index), so the bytes a destination receives are those of a direct send.
// - combine_token: one token of the source is the float32 sum, over ranks in ascending order, of
//   the bf16 rows the ranks that received it sent back, then + bias0, + bias1, rounded to bf16
//   once; its top-k weights are summed the same way (no bias). Each output element sees exactly
//   the operations 0 + row_r0 + row_r1 + ... + bias0 + bias1 in that order whatever the lane
//   split, and there are no multiplies to contract into FMAs, so host and device agree bit for
//   bit. With CombineInput::bias_first (hierarchical internode's last step, where the "ranks"
//   are nodes, as DeepEP's internode combine orders it) the order is (bias0 + bias1) + row_r0 +
//   row_r1 + ..., a missing bias read as +0.
// - V2's order (DeepEP's ElasticBuffer, docs/plans/ELASTIC_BUFFER.md section 2): with
//   CombineInput::order the groups ("ranks": ranks or nodes) are added in the order that table
//   lists for the token, not ascending, and the biases always lead, (bias0 + bias1) + row_g0 +
//   row_g1 + ..., because that is the one sum V2's test compares bit for bit; with
//   CombineInput::weight_owner weight lane k is *selected* from the row of the group that owns
//   lane k's expert (a copy, no add) instead of summed over groups. combine_order.hpp computes
//   both tables from topk_idx. Null tables: V1, unchanged.
//
// Who does the work is a policy type `Lanes` (the CPU twin's "thread block"):
//   uint32_t lane() const, uint32_t count() const   this lane and the number of lanes; element
//                                                   loops stride over lanes
//   void copy_bytes(std::byte* to, const std::byte* from, uint64_t n) const
//                                                   a cooperative copy of n bytes (dispatch only)
// HostLanes below is one lane with memcpy; the kernels use a thread-block copy
// (gpu_side/cuda/ep_block_lanes.cuh). Nothing here allocates or uses std:: containers, so the
// same code compiles for the device.
#pragma once

#include "common/host_device.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_format.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace proxyep::gpu_side::ep {

// One lane on the calling host thread; the token bytes go through memcpy.
struct HostLanes {
  static constexpr uint32_t lane() { return 0; }
  static constexpr uint32_t count() { return 1; }
  void copy_bytes(std::byte* to, const std::byte* from, uint64_t n) const {
    std::memcpy(to, from, static_cast<size_t>(n));
  }
};

// ---- dispatch ----

// Row 0 of every array for one destination (already offset to the sender's first row there).
// The pointers may be another process's memory (CUDA IPC, a shared mapping) or staging for an
// RMA write; a kernel needs them device-accessible.
struct RowSink {
  std::byte* x = nullptr;
  uint32_t* scales = nullptr;
  int64_t* topk_idx = nullptr;
  float* weights = nullptr;
  int32_t* src_index = nullptr;
  int32_t* heads = nullptr;  // [rows, format.heads] (format.heads > 0)
  int64_t first_row = 0;     // the sender's first row in these arrays
  int rank = 0;  // the destination (its experts are the local ones); < 0: a forwarder, which
                 // gets the global expert ids and the weights as they are

  // The sink over `area` laid out as `a` (row_format.hpp).
  PROXYEP_HOST_DEVICE static RowSink at(std::byte* area, const RowAreas& a, int64_t first_row,
                                        int rank) {
    RowSink sink;
    sink.x = area + a.x;
    sink.scales = reinterpret_cast<uint32_t*>(area + a.scales);
    sink.topk_idx = reinterpret_cast<int64_t*>(area + a.topk_idx);
    sink.weights = reinterpret_cast<float*>(area + a.weights);
    sink.src_index = reinterpret_cast<int32_t*>(area + a.src_index);
    sink.heads = reinterpret_cast<int32_t*>(area + a.heads);
    sink.first_row = first_row;
    sink.rank = rank;
    return sink;
  }
};

// The sender's rows as raw pointers (what a TensorRef reduces to, and what a kernel can take).
// Fields the format does not carry may be null.
struct RowInput {
  const std::byte* x = nullptr;         // [N, format.hidden_bytes], contiguous
  const uint32_t* scales = nullptr;     // 4-byte scales (f32 or packed UE8M0 i32), strided
  int64_t scale_row_stride = 0;         // elements, like TensorRef / PyTorch
  int64_t scale_col_stride = 1;         // column-major scales: row stride 1, col stride N
  const int64_t* topk_idx = nullptr;    // [N, format.topk], contiguous, global expert ids
  const float* topk_weights = nullptr;  // [N, format.topk], contiguous (format.weights > 0)
  // The source token index each row carries: src_index[t] (a forwarded row passes its source's
  // on), or null: t itself.
  const int32_t* src_index = nullptr;
  // A row's heads (format.heads > 0): heads[t * head_stride + head_first + j] for j < heads.
  const int32_t* heads = nullptr;
  int64_t head_stride = 0;
  int64_t head_first = 0;
  RowFormat format;
  EpShape shape;
};

// Writes token `t` of `in` as row sink.first_row + `row` of `sink`. Every lane of `lanes` calls
// it with the same arguments; together they write the row once.
template <typename Lanes>
PROXYEP_HOST_DEVICE inline void dispatch_row(const RowInput& in, const RowSink& sink, int64_t row,
                                             int64_t t, const Lanes& lanes) {
  const RowFormat& f = in.format;
  const int64_t r = sink.first_row + row;
  const uint32_t lane = lanes.lane(), lanes_n = lanes.count();
  lanes.copy_bytes(sink.x + r * f.hidden_bytes, in.x + t * f.hidden_bytes, f.hidden_bytes);
  // Scales are 4-byte words (float32, or int32 UE8M0): copied as bits, strides honoured.
  for (uint32_t c = lane; c < f.scale_cols; c += lanes_n)
    sink.scales[r * f.scale_cols + c] =
        in.scales[t * in.scale_row_stride + static_cast<int64_t>(c) * in.scale_col_stride];
  for (uint32_t k = lane; k < f.topk; k += lanes_n) {
    const int64_t expert = in.topk_idx[t * f.topk + k];
    const int64_t local = sink.rank < 0 ? expert : in.shape.local_expert(expert, sink.rank);
    sink.topk_idx[r * f.topk + k] = local;
    if (f.weights > 0)
      sink.weights[r * f.topk + k] = local >= 0 ? in.topk_weights[t * f.topk + k] : 0.0f;
  }
  for (uint32_t j = lane; j < f.heads; j += lanes_n)
    sink.heads[r * f.heads + j] = in.heads[t * in.head_stride + in.head_first + j];
  if (f.src_index > 0 && lane == 0)
    sink.src_index[r] = in.src_index != nullptr ? in.src_index[t] : static_cast<int32_t>(t);
}

// ---- combine ----

// Elements one lane reduces at a time: one 16-byte unit of bf16 (DeepEP's int4), so a device
// lane moves each row's chunk with one vector load. hidden is a multiple of it because
// hidden * 2 bytes is a multiple of kRowUnitBytes.
inline constexpr int kCombineChunk = kRowUnitBytes / 2;

// What the reduce of one source rank reads and writes. Rows from rank r form a block starting
// at row block_base[r]; token t's row in it is send_head[t][r] (-1: t was not sent to r).
struct CombineInput {
  // [num_ranks]: the first row (bf16 [rows, hidden]) and weights (f32 [rows, topk], when
  // topk > 0) of the block rank r returned; a block's row i is the token with send_head == i.
  // Separate pointers per rank, so a block can stay where it is (e.g. this rank's own rows in
  // the caller's x) instead of being copied next to the others. Rows are 16-byte aligned.
  const uint16_t* const* block_rows = nullptr;
  const float* const* block_weights = nullptr;
  // [num_ranks] or null (every block contiguous): a rank r with block_chunk_rows[r] > 0 left its
  // rows where they landed, in chunks of that many rows (the last may be shorter), chunk c's
  // first row at block_chunks[r][c]; block_rows[r] is then unused. Weights stay contiguous.
  const uint16_t* const* const* block_chunks = nullptr;
  const int64_t* block_chunk_rows = nullptr;
  const int32_t* send_head = nullptr;  // [num_tokens, num_ranks]
  const uint16_t* bias0 = nullptr;     // bf16 [num_tokens, hidden] or null
  const uint16_t* bias1 = nullptr;     // bf16 [num_tokens, hidden] or null
  bool bias_first = false;             // the biases start the sum (see the top of this file)
  // V2's reduce order, or null (V1: ranks ascending). [num_tokens, num_ranks]: token t's groups
  // (block indices) in the order their rows are added, ending at the first -1 or after
  // num_ranks entries; a listed group with send_head -1 adds nothing. Setting it implies
  // bias_first (combine_biases_lead): V2 has no biases-last order. Entries are < num_ranks and
  // name each group at most once (a repeat would add its row twice); combine_order.hpp's
  // tables are.
  const int32_t* order = nullptr;
  // V2's weight selection, or null (V1: weights summed over groups). [num_tokens, topk]: the
  // group whose returned row supplies weight lane k of token t, its value copied; -1 (a lane
  // with no expert) or a group that did not receive t gives +0.0f.
  const int32_t* weight_owner = nullptr;
  uint16_t* out = nullptr;       // bf16 [num_tokens, hidden]
  float* out_weights = nullptr;  // f32 [num_tokens, topk] (topk > 0)
  int num_ranks = 0;
  int64_t hidden = 0;  // a multiple of kCombineChunk
  int topk = 0;        // 0: no weights
};

// Row `pos` of rank r's block (CombineInput::block_rows, or its chunks).
PROXYEP_HOST_DEVICE inline const uint16_t* block_row(const CombineInput& in, int r, int64_t pos) {
  if (in.block_chunk_rows == nullptr || in.block_chunk_rows[r] == 0)
    return in.block_rows[r] + pos * in.hidden;
  const int64_t per = in.block_chunk_rows[r];
  return in.block_chunks[r][pos / per] + (pos % per) * in.hidden;
}

// Whether the biases start token sums: asked for, or implied by V2's order.
PROXYEP_HOST_DEVICE inline bool combine_biases_lead(const CombineInput& in) {
  return in.bias_first || in.order != nullptr;
}

// The i-th group (0 <= i < num_ranks) token t adds: V2's order[t][i] (< 0: the list has ended),
// or i (V1: ranks ascending). The reduce of combine_token and of the host twin both walk it, so
// they add the same rows in the same order.
PROXYEP_HOST_DEVICE inline int combine_group(const CombineInput& in, int64_t t, int i) {
  return in.order != nullptr ? in.order[t * in.num_ranks + i] : i;
}

namespace detail {

// One chunk of bf16 bits. On the device a single 16-byte access (the pointer is 16-byte aligned:
// row and array starts are, and chunks are 16 bytes); on the host an element loop the compiler
// vectorises. Bits only: no arithmetic happens here.
PROXYEP_HOST_DEVICE inline void load_chunk(const uint16_t* from, uint16_t (&v)[kCombineChunk]) {
#if defined(__CUDA_ARCH__)
  const uint4 u = *reinterpret_cast<const uint4*>(from);
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = static_cast<uint16_t>(words[i] & 0xffffu);  // little endian: low half first
    v[2 * i + 1] = static_cast<uint16_t>(words[i] >> 16);
  }
#else
  for (int j = 0; j < kCombineChunk; ++j)
    v[j] = from[j];
#endif
}

PROXYEP_HOST_DEVICE inline void store_chunk(uint16_t* to, const uint16_t (&v)[kCombineChunk]) {
#if defined(__CUDA_ARCH__)
  uint32_t words[4];
  for (int i = 0; i < 4; ++i)
    words[i] = static_cast<uint32_t>(v[2 * i]) | (static_cast<uint32_t>(v[2 * i + 1]) << 16);
  *reinterpret_cast<uint4*>(to) = make_uint4(words[0], words[1], words[2], words[3]);
#else
  for (int j = 0; j < kCombineChunk; ++j)
    to[j] = v[j];
#endif
}

PROXYEP_HOST_DEVICE inline void add_chunk(float (&acc)[kCombineChunk], const uint16_t* from) {
  uint16_t v[kCombineChunk];
  load_chunk(from, v);
  for (int j = 0; j < kCombineChunk; ++j)
    acc[j] += bf16_to_float(v[j]);
}

// acc = bias0 + bias1 at element `at` (a missing bias is +0), as the sum's first operation.
PROXYEP_HOST_DEVICE inline void bias_pair(float (&acc)[kCombineChunk], const CombineInput& in,
                                          int64_t at) {
  uint16_t b0[kCombineChunk] = {}, b1[kCombineChunk] = {};
  if (in.bias0 != nullptr) load_chunk(in.bias0 + at, b0);
  if (in.bias1 != nullptr) load_chunk(in.bias1 + at, b1);
  for (int j = 0; j < kCombineChunk; ++j)
    acc[j] = bf16_to_float(b0[j]) + bf16_to_float(b1[j]);
}

}  // namespace detail

// Token `t`'s top-k weights: out_weights[t][k] = sum_r row_weights[r][k], ranks ascending, the
// lanes splitting k; with weight_owner, row_weights[owner][k] itself (V2 selects, so a foreign
// lane's value never leaks into another's sum). (Part of combine_token; the host reduce calls it
// too.)
template <typename Lanes>
PROXYEP_HOST_DEVICE inline void combine_token_weights(const CombineInput& in, int64_t t,
                                                      const Lanes& lanes) {
  const int32_t* head = in.send_head + t * in.num_ranks;
  for (int64_t k = lanes.lane(); k < in.topk; k += lanes.count()) {
    if (in.weight_owner != nullptr) {
      const int32_t owner = in.weight_owner[t * in.topk + k];
      const int32_t pos = owner >= 0 ? head[owner] : -1;
      in.out_weights[t * in.topk + k] =
          pos >= 0 ? in.block_weights[owner][int64_t{pos} * in.topk + k] : 0.0f;
      continue;
    }
    float acc = 0.0f;
    for (int r = 0; r < in.num_ranks; ++r) {
      const int32_t pos = head[r];
      if (pos >= 0) acc += in.block_weights[r][int64_t{pos} * in.topk + k];
    }
    in.out_weights[t * in.topk + k] = acc;
  }
}

// Reduces token `t` of `in`: out[t] = bf16(sum_r rows[r] + bias0[t] + bias1[t]) in float32,
// ranks ascending (or as bias_first / order say, top of this file); out_weights[t] as
// combine_token_weights. Every lane of `lanes` calls it with the same arguments; together they
// write the token once.
template <typename Lanes>
PROXYEP_HOST_DEVICE inline void combine_token(const CombineInput& in, int64_t t,
                                              const Lanes& lanes) {
  const int32_t* head = in.send_head + t * in.num_ranks;
  const bool biases_lead = combine_biases_lead(in);
  const int64_t lane = lanes.lane(), lanes_n = lanes.count();
  for (int64_t c0 = lane * kCombineChunk; c0 < in.hidden; c0 += lanes_n * kCombineChunk) {
    float acc[kCombineChunk];
    for (int j = 0; j < kCombineChunk; ++j)
      acc[j] = 0.0f;
    if (biases_lead) detail::bias_pair(acc, in, t * in.hidden + c0);
    for (int i = 0; i < in.num_ranks; ++i) {
      const int r = combine_group(in, t, i);
      if (r < 0) break;
      const int32_t pos = head[r];
      if (pos < 0) continue;
      detail::add_chunk(acc, block_row(in, r, pos) + c0);
    }
    if (!biases_lead && in.bias0 != nullptr) detail::add_chunk(acc, in.bias0 + t * in.hidden + c0);
    if (!biases_lead && in.bias1 != nullptr) detail::add_chunk(acc, in.bias1 + t * in.hidden + c0);
    uint16_t v[kCombineChunk];
    for (int j = 0; j < kCombineChunk; ++j)
      v[j] = float_to_bf16(acc[j]);
    detail::store_chunk(in.out + t * in.hidden + c0, v);
  }
  combine_token_weights(in, t, lanes);
}

}  // namespace proxyep::gpu_side::ep
