// LlNodeDispatch and LlNodeCombine (integrations/low_latency/ll_node_dispatch.hpp,
// ll_node_combine.hpp) on any DeviceRuntime: the ranks of a node as streams of one device, every
// rank's step memory in that device's memory. Run on the host-simulated device by
// test_ll_node_step.cpp and on CUDA by tests/gpu/test_gpu_signal.cpp. Each case returns "" when it
// held, else what went wrong.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/low_latency/ll_node_combine.hpp"
#include "integrations/low_latency/ll_node_dispatch.hpp"
#include "tests/unit/gpu_side/device/device_ring_cases.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace proxyep::gpu_side::testing::ll_node {

namespace node_step = integrations::low_latency;

using device_ring::kWait;

struct NodeCase {
  ep::LlFormat format;
  int ranks = 3;
  int32_t local_experts = 2;
  int64_t max_tokens = 8;
  int topk = 3;
  bool capture = false;  // each rank's steps captured once and replayed
};

// One rank of the node: its stream, its step memory and tensors (device memory), its steps.
struct NodeRank {
  std::shared_ptr<device::DeviceRuntime> stream;
  std::shared_ptr<std::byte[]> memory, x, topk_idx, weights, recv_x, scales, src_info, recv_count,
      range, expert_out, combined;
  int64_t tokens = 0;
  std::unique_ptr<node_step::LlNodeDispatch> dispatch;
  std::unique_ptr<node_step::LlNodeCombine> combine;
  std::unique_ptr<device::DeviceGraph> dispatch_graph, combine_graph;
  ep::Tensor x_host, topk_host, weights_host;  // what was uploaded this round
  ep::Tensor src_info_host, range_host;        // what the dispatch wrote (read back)
};

// Random inputs: bf16 values of a few bits, distinct experts per token with some -1, weights.
inline void fill_inputs(NodeRank& r, const NodeCase& c, std::mt19937& random) {
  const int32_t experts = c.ranks * c.local_experts;
  r.x_host = ep::Tensor::zeros(ep::DType::bf16, r.tokens, c.format.hidden);
  r.topk_host = ep::Tensor::zeros(ep::DType::i64, r.tokens, c.topk);
  r.weights_host = ep::Tensor::zeros(ep::DType::f32, r.tokens, c.topk);
  std::uniform_int_distribution<int> value(-64, 64);
  for (int64_t i = 0; i < r.x_host.numel(); ++i)
    r.x_host.data<uint16_t>()[i] = ep::float_to_bf16(static_cast<float>(value(random)) / 16.0f);
  for (int64_t i = 0; i < r.weights_host.numel(); ++i)
    r.weights_host.data<float>()[i] = static_cast<float>(value(random)) / 32.0f;
  std::vector<int64_t> choice(static_cast<size_t>(experts));
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int32_t e = 0; e < experts; ++e)
      choice[static_cast<size_t>(e)] = e;
    std::shuffle(choice.begin(), choice.end(), random);
    for (int k = 0; k < c.topk; ++k)
      r.topk_host.data<int64_t>()[t * c.topk + k] =
          random() % 5 == 0 ? -1 : choice[static_cast<size_t>(k)];
  }
}

// The output row of global expert `expert` for token `token` of `home`: distinct per triple.
inline uint16_t expert_value(int64_t expert, int home, int64_t token, uint32_t channel) {
  const auto v = static_cast<int>((expert * 7 + home * 3 + token * 5 + channel) % 23) - 11;
  return ep::float_to_bf16(static_cast<float>(v) / 8.0f);
}

inline std::string check_dispatch(std::vector<NodeRank>& ranks, const NodeCase& c,
                                  const std::string& when) {
  const int64_t rows = c.ranks * c.max_tokens;
  const ep::DType payload = c.format.fp8 ? ep::DType::fp8_e4m3 : ep::DType::bf16;
  std::vector<ep::LlRankInputs> inputs;
  for (NodeRank& r : ranks)
    inputs.push_back({.x = r.x_host, .topk_idx = r.topk_host, .topk_weights = {}});
  const ep::EpShape shape{
      .num_ranks = c.ranks, .ranks_per_node = c.ranks, .num_experts = c.ranks * c.local_experts};
  for (int rank = 0; rank < c.ranks; ++rank) {
    NodeRank& r = ranks[static_cast<size_t>(rank)];
    ep::Tensor recv_x = ep::Tensor::zeros(payload, c.local_experts * rows, c.format.hidden);
    ep::Tensor scales;
    if (c.format.fp8)
      scales = ep::Tensor::zeros(c.format.ue8m0 ? ep::DType::i32 : ep::DType::f32,
                                 c.local_experts * c.format.scale_words(), rows);
    r.src_info_host = ep::Tensor::zeros(ep::DType::i32, c.local_experts, rows);
    ep::Tensor recv_count = ep::Tensor::zeros(ep::DType::i32, c.local_experts);
    r.range_host = ep::Tensor::zeros(ep::DType::i64, c.local_experts, c.ranks);
    r.stream->copy(recv_x.raw(), r.recv_x.get(), recv_x.bytes());
    if (c.format.fp8) r.stream->copy(scales.raw(), r.scales.get(), scales.bytes());
    r.stream->copy(r.src_info_host.raw(), r.src_info.get(), r.src_info_host.bytes());
    r.stream->copy(recv_count.raw(), r.recv_count.get(), recv_count.bytes());
    r.stream->copy(r.range_host.raw(), r.range.get(), r.range_host.bytes());
    r.stream->synchronize("read back", kWait);
    const std::string error = ep::check_ll_dispatch(inputs, shape, c.max_tokens, c.format, rank,
                                                    {.recv_x = recv_x,
                                                     .recv_x_scales = scales,
                                                     .recv_count = recv_count,
                                                     .src_info = r.src_info_host,
                                                     .layout_range = r.range_host});
    if (!error.empty()) return fmt::format("{}, dispatch, rank {}: {}", when, rank, error);
  }
  return "";
}

// Every rank's expert outputs for the rows its dispatch received (expert_value of the row's
// expert, source and token, by the layout read back), uploaded as the combine's x.
inline void upload_expert_outputs(std::vector<NodeRank>& ranks, const NodeCase& c) {
  const int64_t rows = c.ranks * c.max_tokens;
  const uint32_t H = c.format.hidden;
  for (int rank = 0; rank < c.ranks; ++rank) {
    NodeRank& r = ranks[static_cast<size_t>(rank)];
    ep::Tensor out = ep::Tensor::zeros(ep::DType::bf16, c.local_experts * rows, H);
    for (int32_t e = 0; e < c.local_experts; ++e)
      for (int s = 0; s < c.ranks; ++s) {
        const int64_t range = r.range_host.data<int64_t>()[e * c.ranks + s];
        const int64_t first = range >> 32, count = range & 0xffffffff;
        for (int64_t row = first; row < first + count; ++row) {
          const int64_t token = r.src_info_host.data<int32_t>()[e * rows + row];
          uint16_t* o = out.data<uint16_t>() + (e * rows + row) * H;
          for (uint32_t ch = 0; ch < H; ++ch)
            o[ch] = expert_value(rank * c.local_experts + e, s, token, ch);
        }
      }
    r.stream->copy(r.expert_out.get(), out.raw(), out.bytes());
    r.stream->synchronize("upload expert outputs", kWait);
  }
}

inline std::string check_combine(std::vector<NodeRank>& ranks, const NodeCase& c,
                                 const std::string& when) {
  const uint32_t H = c.format.hidden;
  for (int rank = 0; rank < c.ranks; ++rank) {
    NodeRank& r = ranks[static_cast<size_t>(rank)];
    ep::Tensor got = ep::Tensor::zeros(ep::DType::bf16, r.tokens, H);
    r.stream->copy(got.raw(), r.combined.get(), got.bytes());
    r.stream->synchronize("read back", kWait);
    std::vector<uint16_t> row(H);
    const ep::Tensor want = ep::reference_ll_combine(
        r.topk_host, r.weights_host, H, rank, [&](int64_t expert, int home, int64_t token) {
          for (uint32_t ch = 0; ch < H; ++ch)
            row[ch] = expert_value(expert, home, token, ch);
          return row.data();
        });
    if (std::memcmp(got.raw(), want.raw(), got.bytes()) != 0) {
      for (int64_t t = 0; t < r.tokens; ++t)
        if (std::memcmp(got.raw() + t * 2 * H, want.raw() + t * 2 * H, 2 * H) != 0)
          return fmt::format("{}, combine, rank {}: token {} differs from the reference", when,
                             rank, t);
    }
  }
  return "";
}

// Three rounds with new inputs each (the host uploads them between the steps), every rank's
// dispatch step queued (or its graph launched) at once and checked (DeepEP's exact checks), the
// expert outputs uploaded, every rank's combine step run and checked against the reference;
// then three dispatch + combine steps back to back on every rank with no host in between.
inline std::string node_step_case(const std::shared_ptr<device::DeviceRuntime>& device,
                                  const NodeCase& c) {
  const int R = c.ranks;
  const uint32_t H = c.format.hidden;
  const uint64_t slot_bytes =
      node_step::ll_node_slot_bytes(c.format, c.max_tokens, c.local_experts);
  const uint64_t return_bytes =
      node_step::ll_node_return_slot_bytes(H, c.max_tokens, c.local_experts);
  // One allocation per rank: dispatch slots, return slots, counts, then the words.
  const uint64_t returns_at = static_cast<uint64_t>(R) * slot_bytes;
  const uint64_t counts_at = returns_at + static_cast<uint64_t>(R) * return_bytes;
  const uint64_t words_at = counts_at + (4ull * R * c.local_experts + 15) / 16 * 16;
  const uint64_t memory_bytes = words_at + 8ull * (4 * R + 2);
  const int64_t rows = R * c.max_tokens;
  std::vector<NodeRank> ranks(static_cast<size_t>(R));
  for (int rank = 0; rank < R; ++rank) {
    NodeRank& r = ranks[static_cast<size_t>(rank)];
    r.stream = rank == 0 ? device : device->open_stream();
    device::DeviceRuntime& s = *r.stream;
    r.memory = s.allocate(memory_bytes);
    s.fill(r.memory.get(), 0, memory_bytes);
    r.tokens = c.max_tokens - rank % 3;  // ranks send different numbers of tokens
    r.x = s.allocate(std::max<uint64_t>(16, 2ull * r.tokens * H));
    r.topk_idx = s.allocate(std::max<uint64_t>(16, 8ull * r.tokens * c.topk));
    r.weights = s.allocate(std::max<uint64_t>(16, 4ull * r.tokens * c.topk));
    r.recv_x = s.allocate(c.local_experts * rows * c.format.payload_bytes());
    if (c.format.fp8) r.scales = s.allocate(4ull * c.local_experts * c.format.scale_words() * rows);
    r.src_info = s.allocate(4ull * c.local_experts * rows);
    r.recv_count = s.allocate(4ull * c.local_experts);
    r.range = s.allocate(8ull * c.local_experts * R);
    r.expert_out = s.allocate(2ull * H * c.local_experts * rows);
    r.combined = s.allocate(std::max<uint64_t>(16, 2ull * H * r.tokens));
    s.synchronize("setup", kWait);
  }
  auto words_of = [&](int rank) {
    return reinterpret_cast<uint64_t*>(ranks[static_cast<size_t>(rank)].memory.get() + words_at);
  };
  for (int rank = 0; rank < R; ++rank) {
    NodeRank& r = ranks[static_cast<size_t>(rank)];
    uint64_t* words = words_of(rank);
    node_step::LlNodeDispatchPlan plan{
        .rank = rank,
        .ranks = R,
        .local_experts = c.local_experts,
        .slot_bytes = slot_bytes,
        .memory = {},
        .epoch = words + 4 * R,
        .timeout = kWait,
        .format = c.format,
        .max_tokens = c.max_tokens,
        .num_tokens = r.tokens,
        .topk = c.topk,
        .x = reinterpret_cast<const uint16_t*>(r.x.get()),
        .topk_idx = reinterpret_cast<const int64_t*>(r.topk_idx.get()),
        .recv_x = r.recv_x.get(),
        .recv_x_scales = reinterpret_cast<uint32_t*>(r.scales.get()),
        .src_info = reinterpret_cast<int32_t*>(r.src_info.get()),
        .recv_count = reinterpret_cast<int32_t*>(r.recv_count.get()),
        .layout_range = reinterpret_cast<int64_t*>(r.range.get())};
    node_step::LlNodeCombinePlan back{
        .slot_bytes = return_bytes,
        .memory = {},
        .epoch = words + 4 * R + 1,
        .x = reinterpret_cast<const uint16_t*>(r.expert_out.get()),
        .topk_weights = reinterpret_cast<const float*>(r.weights.get()),
        .out = reinterpret_cast<uint16_t*>(r.combined.get())};
    for (int peer = 0; peer < R; ++peer) {
      std::byte* base = ranks[static_cast<size_t>(peer)].memory.get();
      uint64_t* w = words_of(peer);
      plan.memory.push_back({.slots = base,
                             .counts = reinterpret_cast<int32_t*>(base + counts_at),
                             .arrived = w,
                             .released = w + R});
      back.memory.push_back(
          {.slots = base + returns_at, .arrived = w + 2 * R, .released = w + 3 * R});
    }
    // Captured: each step made inside the capture that queues it (as a Buffer call captured by
    // its caller would make it).
    if (c.capture) r.stream->begin_capture("node dispatch");
    r.dispatch =
        std::make_unique<node_step::LlNodeDispatch>(r.stream, std::move(plan), "node step");
    if (c.capture) {
      r.dispatch->queue("node dispatch");
      r.dispatch_graph = r.stream->end_capture("node dispatch");
      r.stream->begin_capture("node combine");
    }
    r.combine = std::make_unique<node_step::LlNodeCombine>(r.stream, *r.dispatch, std::move(back),
                                                           "node step");
    if (c.capture) {
      r.combine->queue("node combine");
      r.combine_graph = r.stream->end_capture("node combine");
    }
  }
  auto step = [&](NodeRank& r, bool dispatch) {
    const std::unique_ptr<device::DeviceGraph>& graph =
        dispatch ? r.dispatch_graph : r.combine_graph;
    if (graph != nullptr)
      r.stream->launch(*graph, "node step replay");
    else if (dispatch)
      r.dispatch->queue("node dispatch");
    else
      r.combine->queue("node combine");
  };
  auto synchronize = [&] {
    for (NodeRank& r : ranks)
      r.stream->synchronize("node step", kWait);
  };

  std::mt19937 random(7);
  try {
    std::string error;
    for (int round = 0; round < 3 && error.empty(); ++round) {
      const std::string when = fmt::format("round {}", round);
      for (NodeRank& r : ranks) {
        fill_inputs(r, c, random);
        r.stream->copy(r.x.get(), r.x_host.raw(), r.x_host.bytes());
        r.stream->copy(r.topk_idx.get(), r.topk_host.raw(), r.topk_host.bytes());
        r.stream->copy(r.weights.get(), r.weights_host.raw(), r.weights_host.bytes());
        r.stream->synchronize("upload", kWait);
      }
      for (NodeRank& r : ranks)
        step(r, true);
      synchronize();
      error = check_dispatch(ranks, c, when);
      if (!error.empty()) break;
      upload_expert_outputs(ranks, c);
      for (NodeRank& r : ranks)
        step(r, false);
      synchronize();
      error = check_combine(ranks, c, when);
    }
    if (!error.empty()) return error;
    for (int s = 0; s < 3; ++s)
      for (NodeRank& r : ranks) {
        step(r, true);
        step(r, false);
      }
    synchronize();
    error = check_dispatch(ranks, c, "three steps back to back");
    if (error.empty()) error = check_combine(ranks, c, "three steps back to back");
    return error;
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace proxyep::gpu_side::testing::ll_node
