// The normal-mode EP kernels against their CPU twins, bit for bit, on one GPU that plays every
// rank: each "rank" generates its inputs (ep::make_rank_inputs), its destination arenas are
// separate device allocations (standing in for CUDA-IPC-mapped peer buffers), and
//   - get_dispatch_layout: the kernel's counts and is_token_in_rank equal compute_dispatch_layout;
//   - dispatch rows: every destination's arena (every byte, padding and untouched filler
//     included) equals the one the CPU twin (dispatch_row on host lanes) fills;
//   - dispatch chunks: every chunk slot of every Buffer stream, likewise;
//   - combine: the kernel's combined rows and weights equal combine_tokens' on the host, in V1's
//     order and with V2's order and weight owners (combine_order.hpp).
// Exits 77 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is usable.
#include "common/error.hpp"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/ep/combine_order.hpp"
#include "gpu_side/ep/host_reduce.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "gpu_side/ep/workload.hpp"

#include "tests/gpu/device_check.hpp"
#include "tests/gpu/device_memory.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;
using proxyep::testing::DeviceMemory;
using proxyep::testing::first_difference;

namespace {

constexpr const char* kPhase = "test_gpu_ep";
constexpr unsigned char kFiller = 0x5a;  // arena bytes no row writes keep this value

void check(cudaError_t status, const char* what) {
  gpu_side::cuda::check_cuda(status, kPhase, what);
}

struct Case {
  std::string name;
  EpShape shape;
  std::vector<int> tokens;  // per rank
  int hidden = 1024;
  int topk = 8;
  double drop = 0.1;
  Routing routing = Routing::random;
  bool fp8 = false;
  bool column_major_scales = false;
  bool weights = true;
  bool topk_in_rows = true;  // false: a cached dispatch's rows (x and scales only)
  bool skip_last = false;    // rows to the last rank go "elsewhere" (a null sink on the GPU)
  int biases = 2;
  int blocks = 0, threads = 0;  // 0: the launch functions' defaults
};

bool same(const char* what, const Case& c, int rank, const void* host, const void* device,
          size_t bytes) {
  const int64_t at = first_difference(host, device, bytes);
  if (at < 0) return true;
  std::printf("FAIL %s: %s of rank %d differs at byte %lld of %zu\n", c.name.c_str(), what, rank,
              static_cast<long long>(at), bytes);
  return false;
}

// ---- get_dispatch_layout ----

bool check_layout(const Case& c, const TensorRef& topk_idx, int rank) {
  const DispatchLayout host = compute_dispatch_layout(topk_idx, c.shape);
  const int64_t n = topk_idx.rows;
  const int R = c.shape.num_ranks;
  DeviceMemory idx(topk_idx.data, topk_idx.bytes());
  DeviceMemory per_rank(sizeof(int32_t) * R), per_expert(sizeof(int32_t) * c.shape.num_experts);
  DeviceMemory per_node(sizeof(int32_t) * c.shape.num_nodes()), in_rank(n * R);
  check(cudaMemset(in_rank.as<void>(), 0xff, n * R), "cudaMemset");  // the kernel writes all
  gpu_side::cuda::LayoutParams p;
  p.topk_idx = idx.as<int64_t>();
  p.num_tokens = n;
  p.topk = static_cast<int>(topk_idx.cols);
  p.shape = c.shape;
  p.tokens_per_rank = per_rank.as<int32_t>();
  p.tokens_per_node = host.num_tokens_per_rdma_rank.defined() ? per_node.as<int32_t>() : nullptr;
  p.tokens_per_expert = per_expert.as<int32_t>();
  p.is_token_in_rank = in_rank.as<bool>();
  check(gpu_side::cuda::launch_dispatch_layout(p, nullptr), "launch_dispatch_layout");
  check(cudaDeviceSynchronize(), "dispatch_layout_kernel");
  bool ok = same("num_tokens_per_rank", c, rank, host.num_tokens_per_rank.raw(),
                 per_rank.download<int32_t>(R).data(), sizeof(int32_t) * R);
  ok &= same("num_tokens_per_expert", c, rank, host.num_tokens_per_expert.raw(),
             per_expert.download<int32_t>(c.shape.num_experts).data(),
             sizeof(int32_t) * c.shape.num_experts);
  if (p.tokens_per_node != nullptr)
    ok &= same("num_tokens_per_rdma_rank", c, rank, host.num_tokens_per_rdma_rank.raw(),
               per_node.download<int32_t>(c.shape.num_nodes()).data(),
               sizeof(int32_t) * c.shape.num_nodes());
  ok &= same("is_token_in_rank", c, rank, host.is_token_in_rank.raw(),
             in_rank.download<unsigned char>(n * R).data(), n * R);
  return ok;
}

// ---- dispatch ----

struct Source {
  RankInputs inputs;
  Tensor scales;                 // the scales as passed (column-major storage when asked)
  TensorRef scales_ref;          // their view, strides included
  Tensor send_head;              // i32 [N, R]
  std::vector<int64_t> rows_to;  // per destination
};

Source make_source(const Case& c, const WorkloadOptions& options, int rank) {
  Source s;
  s.inputs = make_rank_inputs(options, rank);
  const int64_t n = s.inputs.x.rows();
  if (c.fp8) {
    s.scales = s.inputs.x_scales;
    s.scales_ref = s.scales.ref();
    if (c.column_major_scales) {  // DeepEP accepts s.T.contiguous().T: rows stride 1
      const int64_t cols = s.inputs.x_scales.cols();
      s.scales = Tensor::empty(DType::f32, cols, n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t g = 0; g < cols; ++g)
          s.scales.data<float>()[g * n + t] = s.inputs.x_scales.data<float>()[t * cols + g];
      s.scales_ref = TensorRef::strided(s.scales.raw(), DType::f32, n, cols, 1, n);
    }
  }
  // Like Buffer::dispatch: a token's row at d is its position among the tokens sent to d.
  const DispatchLayout layout = compute_dispatch_layout(s.inputs.topk_idx, c.shape);
  const int R = c.shape.num_ranks;
  s.send_head = Tensor::empty(DType::i32, n, R);
  s.rows_to.assign(static_cast<size_t>(R), 0);
  const bool* in_rank = layout.is_token_in_rank.data<bool>();
  for (int64_t t = 0; t < n; ++t)
    for (int d = 0; d < R; ++d)
      s.send_head.data<int32_t>()[t * R + d] =
          in_rank[t * R + d] ? static_cast<int32_t>(s.rows_to[d]++) : -1;
  return s;
}

RowFormat format_of(const Case& c) {
  RowFormat f;
  f.hidden_bytes = static_cast<uint32_t>(c.hidden * (c.fp8 ? 1 : 2));
  f.scale_cols = c.fp8 ? static_cast<uint32_t>(c.hidden / kScaleBlock) : 0;
  f.topk = c.topk_in_rows ? static_cast<uint32_t>(c.topk) : 0;
  f.weights = c.topk_in_rows && c.weights ? static_cast<uint32_t>(c.topk) : 0;
  f.src_index = c.topk_in_rows ? 1 : 0;
  return f;
}

// A source rank's rows as the CPU twin reads them (host) and as a kernel reads them (the same
// arrays copied to the device).
struct SourceRows {
  RowInput host;
  DeviceMemory x, scales, topk_idx, weights;
  RowInput device;

  SourceRows(const Case& c, const Source& src, const RowFormat& f)
      : host(host_input(c, src, f)),
        x(host.x, (c.fp8 ? src.inputs.x_fp8 : src.inputs.x).bytes()),
        scales(c.fp8 ? src.scales.raw() : nullptr, c.fp8 ? src.scales.bytes() : 0),
        topk_idx(src.inputs.topk_idx.raw(), src.inputs.topk_idx.bytes()),
        weights(src.inputs.topk_weights.raw(), src.inputs.topk_weights.bytes()),
        device(host) {
    device.x = x.as<std::byte>();
    device.scales = c.fp8 ? scales.as<uint32_t>() : nullptr;
    device.topk_idx = c.topk_in_rows ? topk_idx.as<int64_t>() : nullptr;
    device.topk_weights = f.weights > 0 ? weights.as<float>() : nullptr;
  }

  // The source's tensors as the raw pointers the shared rule reads.
  static RowInput host_input(const Case& c, const Source& src, const RowFormat& f) {
    RowInput in;
    in.x = (c.fp8 ? src.inputs.x_fp8 : src.inputs.x).raw();
    if (c.fp8) {
      in.scales = src.scales_ref.as<uint32_t>();
      in.scale_row_stride = src.scales_ref.row_stride;
      in.scale_col_stride = src.scales_ref.col_stride;
    }
    in.topk_idx = c.topk_in_rows ? src.inputs.topk_idx.data<int64_t>() : nullptr;
    in.topk_weights = f.weights > 0 ? src.inputs.topk_weights.data<float>() : nullptr;
    in.format = f;
    in.shape = c.shape;
    return in;
  }
};

// The CPU twin of one row.
void write_row(const RowInput& in, const RowSink& sink, int64_t row, int64_t t) {
  dispatch_row(in, sink, row, t, HostLanes{});
}

bool check_dispatch(const Case& c, const std::vector<Source>& sources) {
  const int R = c.shape.num_ranks;
  const RowFormat f = format_of(c);
  std::vector<int64_t> total(static_cast<size_t>(R), 0);
  for (const Source& s : sources)
    for (int d = 0; d < R; ++d)
      total[d] += s.rows_to[d];
  std::vector<RowAreas> areas;
  std::vector<std::vector<std::byte>> host_arena;
  std::vector<DeviceMemory> device_arena;
  for (int d = 0; d < R; ++d) {
    areas.push_back(RowAreas::of(static_cast<uint64_t>(total[d]), f));
    host_arena.emplace_back(areas[d].end, std::byte{kFiller});
    device_arena.emplace_back(areas[d].end);
    check(cudaMemset(device_arena[d].as<void>(), kFiller, areas[d].end), "cudaMemset");
  }
  std::vector<int64_t> base(static_cast<size_t>(R), 0);  // the sender's first row at each d
  for (int s = 0; s < R; ++s) {
    const Source& src = sources[s];
    const int64_t n = src.inputs.x.rows();
    SourceRows rows(c, src, f);
    std::vector<RowSink> host_sinks, device_sinks;
    for (int d = 0; d < R; ++d) {
      host_sinks.push_back(RowSink::at(host_arena[d].data(), areas[d], base[d], d));
      device_sinks.push_back(RowSink::at(device_arena[d].as<std::byte>(), areas[d], base[d], d));
    }
    if (c.skip_last) device_sinks[R - 1] = RowSink{};
    const int32_t* head = src.send_head.data<int32_t>();
    for (int64_t t = 0; t < n; ++t)
      for (int d = 0; d < R; ++d)
        if (head[t * R + d] >= 0 && !(c.skip_last && d == R - 1))
          write_row(rows.host, host_sinks[d], head[t * R + d], t);
    // The kernel.
    DeviceMemory dhead(src.send_head.raw(), src.send_head.bytes());
    DeviceMemory dsinks(device_sinks.data(), sizeof(RowSink) * R);
    gpu_side::cuda::DispatchParams p;
    p.input = rows.device;
    p.send_head = dhead.as<int32_t>();
    p.sinks = dsinks.as<RowSink>();
    p.num_tokens = n;
    if (c.blocks > 0) p.blocks = c.blocks;
    if (c.threads > 0) p.threads = c.threads;
    check(gpu_side::cuda::launch_dispatch_rows(p, nullptr), "launch_dispatch_rows");
    check(cudaDeviceSynchronize(), "dispatch_rows_kernel");
    for (int d = 0; d < R; ++d)
      base[d] += src.rows_to[d];
  }
  bool ok = true;
  for (int d = 0; d < R; ++d)
    ok &= same("dispatch arena", c, d, host_arena[d].data(),
               device_arena[d].download<std::byte>(areas[d].end).data(), areas[d].end);
  return ok;
}

// Chunks of Buffer streams: for every (source, destination) pair, the destination's rows split
// into chunks of a third of them; each chunk's slot (every byte) must equal the CPU twin's.
bool check_dispatch_chunks(const Case& c, const std::vector<Source>& sources) {
  const int R = c.shape.num_ranks;
  const RowFormat f = format_of(c);
  bool ok = true;
  for (int s = 0; s < R; ++s) {
    const Source& src = sources[s];
    SourceRows source_rows(c, src, f);
    gpu_side::cuda::ChunkParams p;
    p.input = source_rows.device;
    if (c.blocks > 0) p.blocks = c.blocks;
    if (c.threads > 0) p.threads = c.threads;
    const int64_t n = src.inputs.x.rows();
    for (int d = 0; d < R; ++d) {
      std::vector<int32_t> tokens(static_cast<size_t>(src.rows_to[d]));
      for (int64_t t = 0; t < n; ++t)
        if (const int32_t row = src.send_head.data<int32_t>()[t * R + d]; row >= 0)
          tokens[static_cast<size_t>(row)] = static_cast<int32_t>(t);
      const auto rows = static_cast<int64_t>(tokens.size());
      const int64_t per_chunk = std::max<int64_t>(1, (rows + 2) / 3);
      DeviceMemory dtokens(tokens.data(), tokens.size() * sizeof(int32_t));
      for (int64_t first = 0; first < rows; first += per_chunk) {
        const int64_t m = std::min(per_chunk, rows - first);
        const RowAreas areas = RowAreas::of(static_cast<uint64_t>(m), f);
        std::vector<std::byte> host_slot(areas.end, std::byte{kFiller});
        const RowSink host_sink = RowSink::at(host_slot.data(), areas, 0, d);
        for (int64_t i = 0; i < m; ++i)
          write_row(source_rows.host, host_sink, i, tokens[static_cast<size_t>(first + i)]);
        DeviceMemory slot(areas.end);
        check(cudaMemset(slot.as<void>(), kFiller, areas.end), "cudaMemset");
        p.tokens = dtokens.as<int32_t>() + first;
        p.sink = RowSink::at(slot.as<std::byte>(), areas, 0, d);
        p.rows = m;
        check(gpu_side::cuda::launch_dispatch_chunk(p, nullptr), "launch_dispatch_chunk");
        check(cudaDeviceSynchronize(), "dispatch_chunk_kernel");
        ok &= same("dispatch chunk", c, d, host_slot.data(),
                   slot.download<std::byte>(areas.end).data(), areas.end);
      }
    }
  }
  return ok;
}

// ---- combine ----

// bf16 values of mixed magnitudes and signs, so sums round in every direction. No NaN or
// infinity: x86 and the GPU propagate different NaN bit patterns (inf - inf included), which
// combine does not promise to preserve.
std::vector<uint16_t> random_bf16(size_t count, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-8, 8);
  std::vector<uint16_t> out(count);
  for (uint16_t& v : out)
    v = float_to_bf16(std::ldexp(normal(gen), scale(gen)));
  return out;
}

bool check_combine(const Case& c, const std::vector<Source>& sources) {
  const int R = c.shape.num_ranks;
  const int topk = c.weights ? c.topk : 0;
  std::mt19937_64 gen(0x5eed + static_cast<uint64_t>(R));
  bool ok = true;
  for (int s = 0; s < R; ++s) {
    const Source& src = sources[s];
    const int64_t n = src.inputs.x.rows();
    // At source s the block from rank r holds the rows s dispatched to r, in send_head order.
    std::vector<int64_t> bases(static_cast<size_t>(R), 0);
    int64_t rows = 0;
    for (int r = 0; r < R; ++r) {
      bases[r] = rows;
      rows += src.rows_to[r];
    }
    const std::vector<uint16_t> row_x = random_bf16(static_cast<size_t>(rows * c.hidden), gen);
    std::vector<float> row_w(static_cast<size_t>(rows * topk));
    std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
    for (float& w : row_w)
      w = weight(gen);
    const std::vector<uint16_t> bias0 = random_bf16(static_cast<size_t>(n * c.hidden), gen);
    const std::vector<uint16_t> bias1 = random_bf16(static_cast<size_t>(n * c.hidden), gen);
    std::vector<uint16_t> host_out(static_cast<size_t>(n * c.hidden));
    std::vector<float> host_w(static_cast<size_t>(n * topk));

    std::vector<const uint16_t*> block_rows(static_cast<size_t>(R));
    std::vector<const float*> block_weights(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      block_rows[r] = row_x.data() + bases[r] * c.hidden;
      block_weights[r] = row_w.data() + bases[r] * topk;
    }
    CombineInput in;
    in.block_rows = block_rows.data();
    in.block_weights = topk > 0 ? block_weights.data() : nullptr;
    in.send_head = src.send_head.data<int32_t>();
    in.bias0 = c.biases >= 1 ? bias0.data() : nullptr;
    in.bias1 = c.biases >= 2 ? bias1.data() : nullptr;
    in.out = host_out.data();
    in.out_weights = topk > 0 ? host_w.data() : nullptr;
    in.num_ranks = R;
    in.hidden = c.hidden;
    in.topk = topk;
    reduce_tokens_host(in, 0, n);  // the CPU twin

    DeviceMemory drows(row_x.data(), row_x.size() * 2), dw(row_w.data(), row_w.size() * 4);
    std::vector<const uint16_t*> dblock_rows(static_cast<size_t>(R));
    std::vector<const float*> dblock_weights(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      dblock_rows[r] = drows.as<uint16_t>() + bases[r] * c.hidden;
      dblock_weights[r] = dw.as<float>() + bases[r] * topk;
    }
    DeviceMemory drow_ptrs(dblock_rows.data(), dblock_rows.size() * sizeof(void*));
    DeviceMemory dweight_ptrs(dblock_weights.data(), dblock_weights.size() * sizeof(void*));
    DeviceMemory dhead(src.send_head.raw(), src.send_head.bytes());
    DeviceMemory db0(bias0.data(), bias0.size() * 2), db1(bias1.data(), bias1.size() * 2);
    DeviceMemory dout(host_out.size() * 2), dout_w(host_w.size() * 4);
    gpu_side::cuda::CombineParams p;
    p.input = in;
    p.input.block_rows = reinterpret_cast<const uint16_t* const*>(drow_ptrs.as<void*>());
    p.input.block_weights =
        topk > 0 ? reinterpret_cast<const float* const*>(dweight_ptrs.as<void*>()) : nullptr;
    p.input.send_head = dhead.as<int32_t>();
    p.input.bias0 = c.biases >= 1 ? db0.as<uint16_t>() : nullptr;
    p.input.bias1 = c.biases >= 2 ? db1.as<uint16_t>() : nullptr;
    p.input.out = dout.as<uint16_t>();
    p.input.out_weights = topk > 0 ? dout_w.as<float>() : nullptr;
    p.num_tokens = n;
    if (c.blocks > 0) p.blocks = c.blocks;
    if (c.threads > 0) p.threads = c.threads;
    check(gpu_side::cuda::launch_combine(p, nullptr), "launch_combine");
    check(cudaDeviceSynchronize(), "combine_kernel");
    ok &= same("combined_x", c, s, host_out.data(), dout.download<uint16_t>(host_out.size()).data(),
               host_out.size() * 2);
    if (topk > 0)
      ok &= same("combined_topk_weights", c, s, host_w.data(),
                 dout_w.download<float>(host_w.size()).data(), host_w.size() * 4);

    // DeepEP V2's order and weight selection (combine_order.hpp) over the same rows: the
    // kernel reads the tables from device memory and must add what the twin adds.
    const CombineOrderTables v2 =
        compute_combine_order(src.inputs.topk_idx, c.shape, CombineGroups::rank);
    in.order = v2.order.data<int32_t>();
    in.weight_owner = v2.weight_owner.data<int32_t>();
    reduce_tokens_host(in, 0, n);
    DeviceMemory dorder(v2.order.raw(), v2.order.bytes());
    DeviceMemory downer(v2.weight_owner.raw(), v2.weight_owner.bytes());
    p.input.order = dorder.as<int32_t>();
    p.input.weight_owner = downer.as<int32_t>();
    check(gpu_side::cuda::launch_combine(p, nullptr), "launch_combine (V2 order)");
    check(cudaDeviceSynchronize(), "combine_kernel (V2 order)");
    ok &= same("combined_x (V2 order)", c, s, host_out.data(),
               dout.download<uint16_t>(host_out.size()).data(), host_out.size() * 2);
    if (topk > 0)
      ok &= same("combined_topk_weights (V2 owners)", c, s, host_w.data(),
                 dout_w.download<float>(host_w.size()).data(), host_w.size() * 4);
  }
  return ok;
}

bool run_case(const Case& c) {
  WorkloadOptions options;
  options.shape = c.shape;
  options.tokens_per_rank = c.tokens;
  options.hidden = c.hidden;
  options.topk = c.topk;
  options.routing = c.routing;
  options.drop_fraction = c.drop;
  options.fp8 = c.fp8;
  options.seed = 17 + static_cast<uint64_t>(c.shape.num_ranks);
  std::vector<Source> sources;
  for (int r = 0; r < c.shape.num_ranks; ++r)
    sources.push_back(make_source(c, options, r));
  bool ok = true;
  for (int r = 0; r < c.shape.num_ranks; ++r)
    ok &= check_layout(c, sources[r].inputs.topk_idx, r);
  ok &= check_dispatch(c, sources);
  ok &= check_dispatch_chunks(c, sources);
  if (c.topk_in_rows) ok &= check_combine(c, sources);  // combine once per shape
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", c.name.c_str());
  return ok;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  {
    Case c;
    c.name = "bf16, 2 ranks, top-2 of 8";
    c.shape = {.num_ranks = 2, .ranks_per_node = 2, .num_experts = 8};
    c.tokens = {300, 1};
    c.topk = 2;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "bf16, 4 ranks, hidden 7168, skewed, 0 tokens on one rank, 1 bias";
    c.shape = {.num_ranks = 4, .ranks_per_node = 4, .num_experts = 32};
    c.tokens = {257, 0, 64, 129};
    c.hidden = 7168;
    c.routing = Routing::skewed;
    c.biases = 1;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "fp8, 8 ranks, row-major scales, small grid";
    c.shape = {.num_ranks = 8, .ranks_per_node = 8, .num_experts = 64};
    c.tokens = std::vector<int>(8, 200);
    c.fp8 = true;
    c.blocks = 3;
    c.threads = 64;
    c.biases = 0;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "fp8, 16 ranks on 4 nodes, column-major scales, per-node counts";
    c.shape = {.num_ranks = 16, .ranks_per_node = 4, .num_experts = 128};
    c.tokens = std::vector<int>(16, 96);
    c.hidden = 2048;
    c.fp8 = true;
    c.column_major_scales = true;
    c.drop = 0.3;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "bf16, 3 ranks, no weights, last rank elsewhere";
    c.shape = {.num_ranks = 3, .ranks_per_node = 1, .num_experts = 24};
    c.tokens = {150, 151, 152};
    c.hidden = 520;  // 1040 bytes: a multiple of 16, not of 128
    c.weights = false;
    c.skip_last = true;
    c.threads = 32;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "fp8, 4 ranks, cached rows (x and scales only)";
    c.shape = {.num_ranks = 4, .ranks_per_node = 2, .num_experts = 16};
    c.tokens = {100, 50, 25, 0};
    c.fp8 = true;
    c.column_major_scales = true;
    c.topk_in_rows = false;
    all.push_back(c);
  }
  {
    Case c;
    c.name = "bf16, 2 ranks, everything to one expert";
    c.shape = {.num_ranks = 2, .ranks_per_node = 2, .num_experts = 4};
    c.tokens = {500, 500};
    c.topk = 4;
    c.routing = Routing::one_expert;
    c.drop = 0.0;
    all.push_back(c);
  }
  return all;
}

}  // namespace

int main() {
  return proxyep::testing::run_gpu_cases(cases(), run_case);
}
