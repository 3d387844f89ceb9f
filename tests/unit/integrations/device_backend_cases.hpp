// The DeviceBackend (integrations/backend/device_backend.hpp) against the HostBackend, operation
// by operation, bit for bit, on any DeviceRuntime: the host-simulated device in the unit test
// (tests/unit/integrations/test_device_backend.cpp), CUDA in the GPU test
// (tests/gpu/test_gpu_backend.cpp). The inputs and sinks sit where the Buffer puts them: the
// caller's tensors and received rows in device memory, arenas in registered host memory, the
// index arrays (tokens, send_head, combine's tables) in plain host memory.
//
// Each case returns "" when the two backends agree, else what differs.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/backend/device_backend.hpp"
#include "integrations/backend/host_backend.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace proxyep::testing::device_backend_cases {

namespace ep = gpu_side::ep;
using integrations::DeviceBackend;
using integrations::HostBackend;
using integrations::RowSource;

inline ep::Tensor to_device(DeviceBackend& backend, const ep::Tensor& host) {
  if (!host.defined()) return {};
  ep::Tensor t = host.dims() == 1 ? backend.allocate(host.dtype(), host.rows())
                                  : backend.allocate(host.dtype(), host.rows(), host.cols());
  backend.device().copy(t.raw(), host.raw(), host.bytes());
  backend.device().synchronize("test upload", std::chrono::seconds(30));
  return t;
}

inline ep::Tensor to_host(DeviceBackend& backend, const ep::Tensor& device) {
  if (!device.defined()) return {};
  ep::Tensor t = device.dims() == 1
                     ? ep::Tensor::empty(device.dtype(), device.rows())
                     : ep::Tensor::empty(device.dtype(), device.rows(), device.cols());
  backend.device().copy(t.raw(), device.raw(), device.bytes());
  backend.device().synchronize("test download", std::chrono::seconds(30));
  return t;
}

// Host tensors of reproducible values (bf16 in [-15, 16), f32 in [0, 12.5]).
inline ep::Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  ep::Tensor t = ep::Tensor::empty(ep::DType::bf16, rows, cols);
  uint64_t s = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.data<uint16_t>()[i] =
        ep::float_to_bf16(static_cast<float>(static_cast<int64_t>(s >> 40) % 2000) / 64.0f - 15.0f);
  }
  return t;
}

inline ep::Tensor random_f32(int64_t rows, int64_t cols, uint64_t seed) {
  ep::Tensor t = ep::Tensor::empty(ep::DType::f32, rows, cols);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>((i * 37 + static_cast<int64_t>(seed)) % 101) / 8.0f;
  return t;
}

inline std::string compare(const char* what, const void* got, const void* want, size_t bytes) {
  const auto* a = static_cast<const uint8_t*>(got);
  const auto* b = static_cast<const uint8_t*>(want);
  for (size_t i = 0; i < bytes; ++i)
    if (a[i] != b[i])
      return fmt::format("{}: byte {} of {} is {:#04x}, host backend {:#04x}\n", what, i, bytes,
                         a[i], b[i]);
  return "";
}

inline std::string compare(const char* what, const ep::Tensor& got_device, const ep::Tensor& want,
                           DeviceBackend& backend) {
  if (got_device.defined() != want.defined()) return fmt::format("{}: defined differs\n", what);
  if (!want.defined()) return "";
  if (got_device.device() != ep::Device::cuda)
    return fmt::format("{}: the device backend returned a host tensor\n", what);
  if (got_device.rows() != want.rows() || got_device.cols() != want.cols() ||
      got_device.dims() != want.dims())
    return fmt::format("{}: shape differs\n", what);
  ep::Tensor got = to_host(backend, got_device);
  return compare(what, got.raw(), want.raw(), want.bytes());
}

// An arena: host pages the device reaches (registered), like a node's shared receive arena.
class Arena {
 public:
  Arena(gpu_side::device::DeviceRuntime& device, size_t bytes, uint8_t poison)
      : device_(device), bytes_((bytes + 4095) / 4096 * 4096) {
    host_ = static_cast<std::byte*>(
        ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    require(host_ != MAP_FAILED, "test", "arena mmap");
    std::memset(host_, poison, bytes_);
    device_address_ = static_cast<std::byte*>(device_.register_host(host_, bytes_));
  }
  ~Arena() {
    device_.unregister_host(host_);
    ::munmap(host_, bytes_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  std::byte* host() const { return host_; }
  std::byte* device() const { return device_address_; }

 private:
  gpu_side::device::DeviceRuntime& device_;
  size_t bytes_;
  std::byte* host_ = nullptr;
  std::byte* device_address_ = nullptr;
};

struct Inputs {
  ep::WorkloadOptions options;
  ep::RankInputs host;
  ep::Tensor x, x_scales, topk_idx, topk_weights;  // on the device

  Inputs(DeviceBackend& backend, bool fp8, int ranks) {
    options.shape = ep::EpShape{ranks, ranks <= 8 ? ranks : 8, ranks * 4};
    options.num_tokens = 37;
    options.hidden = 512;
    options.topk = 4;
    options.drop_fraction = 0.1;
    options.fp8 = fp8;
    options.seed = fp8 ? 7 : 3;
    host = ep::make_rank_inputs(options, 1);
    x = to_device(backend, fp8 ? host.x_fp8 : host.x);
    x_scales = to_device(backend, fp8 ? host.x_scales : ep::Tensor());
    topk_idx = to_device(backend, host.topk_idx);
    topk_weights = to_device(backend, host.topk_weights);
  }
  ep::RowFormat format() const {
    ep::RowFormat f;
    f.hidden_bytes = static_cast<uint32_t>(options.fp8 ? options.hidden : options.hidden * 2);
    f.scale_cols = options.fp8 ? static_cast<uint32_t>(host.x_scales.cols()) : 0;
    f.topk = static_cast<uint32_t>(options.topk);
    f.weights = f.topk;
    f.src_index = 1;
    return f;
  }
  RowSource device_source() const {
    return {x, x_scales, topk_idx, topk_weights, format(), options.shape};
  }
  RowSource host_source() const {
    return {options.fp8 ? host.x_fp8 : host.x,
            options.fp8 ? host.x_scales : ep::Tensor(),
            host.topk_idx,
            host.topk_weights,
            format(),
            options.shape};
  }
};

// get_dispatch_layout, within one NVLink domain and beyond it (per-node counts), and its
// argument checks (a bad expert id found on the device copy, a host tensor refused).
inline std::string layout_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  HostBackend host(1);
  std::string diff;
  for (int ranks : {4, 16}) {
    Inputs in(backend, false, ranks);
    const ep::DispatchLayout want = host.layout(in.host.topk_idx, in.options.shape);
    const ep::DispatchLayout got = backend.layout(in.topk_idx, in.options.shape);
    diff +=
        compare("num_tokens_per_rank", got.num_tokens_per_rank, want.num_tokens_per_rank, backend);
    diff += compare("num_tokens_per_rdma_rank", got.num_tokens_per_rdma_rank,
                    want.num_tokens_per_rdma_rank, backend);
    diff += compare("num_tokens_per_expert", got.num_tokens_per_expert, want.num_tokens_per_expert,
                    backend);
    diff += compare("is_token_in_rank", got.is_token_in_rank, want.is_token_in_rank, backend);
  }
  Inputs in(backend, false, 4);
  ep::Tensor bad = in.host.topk_idx.clone();
  bad.data<int64_t>()[5] = 99;
  const ep::Tensor bad_device = to_device(backend, bad);
  auto error_of = [&](const ep::TensorRef& topk) -> std::string {
    try {
      backend.layout(topk, in.options.shape);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  if (error_of(bad_device).find("topk_idx[1, 1] = 99 is out of range") == std::string::npos)
    diff += "an out-of-range expert id on the device was not refused by name\n";
  if (error_of(in.host.topk_idx).find("in host memory") == std::string::npos)
    diff += "a host topk_idx was not refused\n";
  return diff;
}

// Dispatch's chunk packing into a peer's arena (registered host memory), token list on the host,
// bf16 and fp8 (strided column-major scales).
inline std::string pack_rows_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                                  bool fp8) {
  DeviceBackend backend(device);
  HostBackend host(1);
  Inputs in(backend, fp8, 4);
  // fp8: column-major scales, as DeepEP's callers pass them (the rule honours the strides).
  ep::Tensor colmajor_host, colmajor_device;
  const int64_t n = in.host.topk_idx.rows();
  const int64_t s = fp8 ? in.host.x_scales.cols() : 0;
  if (fp8) {
    colmajor_host = ep::Tensor::empty(ep::DType::f32, s, n);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < s; ++c)
        colmajor_host.data<float>()[c * n + r] = in.host.x_scales.data<float>()[r * s + c];
    colmajor_device = to_device(backend, colmajor_host);
  }
  std::vector<int32_t> tokens = {5, 0, 36, 7, 7, 20, 1};
  const ep::RowFormat format = in.format();
  const int64_t first_row = 3;
  const ep::RowAreas areas = ep::RowAreas::of(first_row + tokens.size(), format);
  Arena got(*device, areas.end, 0xcd), want(*device, areas.end, 0xcd);
  auto source = [&](RowSource src, const ep::Tensor& colmajor) {
    if (fp8) {
      src.x_scales = ep::TensorRef::strided(colmajor.raw(), ep::DType::f32, n, s, 1, n);
      src.x_scales.device = colmajor.device();
    }
    return src;
  };
  backend.pack_rows(source(in.device_source(), colmajor_device),
                    ep::RowSink::at(got.device(), areas, first_row, 2), tokens);
  host.pack_rows(source(in.host_source(), colmajor_host),
                 ep::RowSink::at(want.host(), areas, first_row, 2), tokens);
  // The backend took the token list with the call (RowBackend): changing it now changes nothing.
  std::fill(tokens.begin(), tokens.end(), 0);
  // The arena is host memory the kernel writes: read only once the work is done.
  backend.complete("test");
  return compare(fp8 ? "fp8 arena" : "bf16 arena", got.host(), want.host(), areas.end);
}

// Dispatch's rows to the rank itself, placed by send_head straight into device outputs.
inline std::string place_routed_rows_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  HostBackend host(1);
  Inputs in(backend, false, 4);
  const ep::DispatchLayout layout = host.layout(in.host.topk_idx, in.options.shape);
  const int ranks = 4;
  const int64_t tokens = in.host.topk_idx.rows();
  std::vector<int32_t> send_head(static_cast<size_t>(tokens * ranks), -1);
  std::vector<int32_t> count(ranks, 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int r = 0; r < ranks; ++r)
      if (layout.is_token_in_rank.data<bool>()[t * ranks + r])
        send_head[static_cast<size_t>(t * ranks + r)] = count[static_cast<size_t>(r)]++;
  const integrations::TokenRoutes routes{layout.is_token_in_rank.data<bool>(), send_head.data(),
                                         ranks, tokens};
  const int d = 1;
  const int64_t first = 2, rows = first + count[d];
  const ep::RowFormat f = in.format();
  auto outputs = [&](integrations::RowBackend& b) {
    std::vector<ep::Tensor> t = {b.allocate(ep::DType::bf16, rows, in.options.hidden),
                                 b.allocate(ep::DType::i64, rows, f.topk),
                                 b.allocate(ep::DType::f32, rows, f.topk),
                                 b.allocate(ep::DType::i32, rows)};
    for (auto& tensor : t)
      b.fill(tensor.raw(), 0xee, tensor.bytes());
    return t;
  };
  auto sink_of = [&](std::vector<ep::Tensor>& t) {
    ep::RowSink s;
    s.x = t[0].raw();
    s.topk_idx = t[1].data<int64_t>();
    s.weights = t[2].data<float>();
    s.src_index = t[3].data<int32_t>();
    s.first_row = first;
    s.rank = d;
    return s;
  };
  std::vector<ep::Tensor> got = outputs(backend), want = outputs(host);
  backend.place_routed_rows(in.device_source(), sink_of(got), routes);
  host.place_routed_rows(in.host_source(), sink_of(want), routes);
  std::string diff;
  const char* names[] = {"recv_x", "recv_topk_idx", "recv_topk_weights", "recv_src_idx"};
  for (size_t i = 0; i < got.size(); ++i)
    diff += compare(names[i], got[i], want[i], backend);
  return diff;
}

// Combine's reduce: rank 0's block in device memory, rank 1's left in a registered arena in
// chunks of 4 rows, rank 2's block in device memory, rank 3 sending nothing; two biases, weights.
inline std::string reduce_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  HostBackend host(1);
  const int ranks = 4, topk = 3;
  const int64_t tokens = 29, hidden = 256;
  std::vector<int32_t> send_head(static_cast<size_t>(tokens * ranks), -1);
  std::vector<int64_t> block_rows(ranks, 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int r = 0; r < 3; ++r)
      if ((t * 7 + r * 3) % 5 != 0)
        send_head[static_cast<size_t>(t * ranks + r)] =
            static_cast<int32_t>(block_rows[static_cast<size_t>(r)]++);
  std::vector<ep::Tensor> rows_host, weights_host;
  for (int r = 0; r < ranks; ++r) {
    rows_host.push_back(random_bf16(std::max<int64_t>(block_rows[r], 1), hidden, 11 + r));
    weights_host.push_back(random_f32(std::max<int64_t>(block_rows[r], 1), topk, 5 + r));
  }
  const ep::Tensor bias0 = random_bf16(tokens, hidden, 91), bias1 = random_bf16(tokens, hidden, 92);

  // Rank 1's rows in chunks of 4, in an arena (reversed chunk order, to prove the table is used).
  const int64_t per = 4, chunks = (block_rows[1] + per - 1) / per;
  const uint64_t row_bytes = static_cast<uint64_t>(hidden) * 2;
  Arena arena(*device, static_cast<size_t>(chunks * per) * row_bytes, 0);
  std::vector<const uint16_t*> chunk_host(static_cast<size_t>(chunks)),
      chunk_device(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t offset = static_cast<uint64_t>(chunks - 1 - c) * per * row_bytes;
    const int64_t n = std::min(per, block_rows[1] - c * per);
    std::memcpy(arena.host() + offset, rows_host[1].raw() + c * per * row_bytes,
                static_cast<size_t>(n) * row_bytes);
    chunk_host[static_cast<size_t>(c)] = reinterpret_cast<const uint16_t*>(arena.host() + offset);
    chunk_device[static_cast<size_t>(c)] =
        reinterpret_cast<const uint16_t*>(arena.device() + offset);
  }
  const std::vector<int64_t> chunk_rows = {0, per, 0, 0};

  std::vector<ep::Tensor> rows_dev, weights_dev;
  for (int r = 0; r < ranks; ++r) {
    rows_dev.push_back(to_device(backend, rows_host[r]));
    weights_dev.push_back(to_device(backend, weights_host[r]));
  }
  const ep::Tensor bias0_dev = to_device(backend, bias0), bias1_dev = to_device(backend, bias1);
  ep::Tensor out_dev = backend.allocate(ep::DType::bf16, tokens, hidden),
             out_w_dev = backend.allocate(ep::DType::f32, tokens, topk);
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, tokens, hidden),
             out_w = ep::Tensor::empty(ep::DType::f32, tokens, topk);

  auto input = [&](std::vector<ep::Tensor>& rows, std::vector<ep::Tensor>& weights,
                   std::vector<const uint16_t*>& chunk_table, const ep::Tensor& b0,
                   const ep::Tensor& b1, ep::Tensor& o, ep::Tensor& ow,
                   std::vector<const uint16_t*>& row_ptrs, std::vector<const float*>& weight_ptrs,
                   std::vector<const uint16_t* const*>& chunk_ptrs) {
    for (int r = 0; r < ranks; ++r) {
      row_ptrs[static_cast<size_t>(r)] = rows[static_cast<size_t>(r)].data<uint16_t>();
      weight_ptrs[static_cast<size_t>(r)] = weights[static_cast<size_t>(r)].data<float>();
      chunk_ptrs[static_cast<size_t>(r)] = r == 1 ? chunk_table.data() : nullptr;
    }
    ep::CombineInput c;
    c.block_rows = row_ptrs.data();
    c.block_weights = weight_ptrs.data();
    c.block_chunks = chunk_ptrs.data();
    c.block_chunk_rows = chunk_rows.data();
    c.send_head = send_head.data();
    c.bias0 = b0.data<uint16_t>();
    c.bias1 = b1.data<uint16_t>();
    c.out = o.data<uint16_t>();
    c.out_weights = ow.data<float>();
    c.num_ranks = ranks;
    c.hidden = hidden;
    c.topk = topk;
    return c;
  };
  std::vector<const uint16_t*> rp_dev(ranks), rp_host(ranks);
  std::vector<const float*> wp_dev(ranks), wp_host(ranks);
  std::vector<const uint16_t*const*> cp_dev(ranks), cp_host(ranks);
  backend.reduce(input(rows_dev, weights_dev, chunk_device, bias0_dev, bias1_dev, out_dev,
                       out_w_dev, rp_dev, wp_dev, cp_dev),
                 tokens);
  host.reduce(input(rows_host, weights_host, chunk_host, bias0, bias1, out, out_w, rp_host, wp_host,
                    cp_host),
              tokens);
  return compare("combined_x", out_dev, out, backend) +
         compare("combined_topk_weights", out_w_dev, out_w, backend);
}

// copy_rows, copy_runs and fill between device memory and a registered arena.
inline std::string copy_fill_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  Arena arena(*device, 4096, 0);
  for (int i = 0; i < 4096; ++i)
    arena.host()[i] = static_cast<std::byte>(i * 31);
  ep::Tensor t = backend.allocate(ep::DType::u8, 10, 300);
  backend.fill(t.raw(), 0x11, t.bytes());
  backend.copy_rows(t.raw() + 300, arena.device() + 64, 5, 300);
  backend.copy_rows(arena.device() + 2048, t.raw(), 2, 300);
  // Runs in one batch, whole 16-byte words and not (the kernel's two paths); the run table is
  // taken with the call (it changes before the work runs).
  std::vector<ep::CopyRun> runs = {
      {.to = t.raw() + 6 * 300, .from = arena.device() + 1024, .bytes = 300},
      {.to = t.raw() + 8 * 300 + 4, .from = arena.device() + 3000, .bytes = 7},
      {.to = arena.device() + 3072, .from = arena.device() + 512, .bytes = 256}};
  backend.copy_runs(runs);
  runs.assign(runs.size(), ep::CopyRun{});
  ep::Tensor want = ep::Tensor::empty(ep::DType::u8, 10, 300);
  std::memset(want.raw(), 0x11, want.bytes());
  std::vector<std::byte> arena_before(4096);
  for (int i = 0; i < 4096; ++i)
    arena_before[static_cast<size_t>(i)] = static_cast<std::byte>(i * 31);
  std::memcpy(want.raw() + 300, arena_before.data() + 64, 1500);
  std::memcpy(arena_before.data() + 2048, want.raw(), 600);
  std::memcpy(want.raw() + 6 * 300, arena_before.data() + 1024, 300);
  std::memcpy(want.raw() + 8 * 300 + 4, arena_before.data() + 3000, 7);
  std::memcpy(arena_before.data() + 3072, arena_before.data() + 512, 256);
  backend.complete("test");
  return compare("tensor", t, want, backend) +
         compare("arena", arena.host(), arena_before.data(), 4096);
}

// Host values written into device memory and added to statistics tensors (taken with the call:
// the host arrays change before the work runs).
inline std::string write_add_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  HostBackend host(1);
  std::vector<int32_t> counts = {3, -1, 7, 0, 12};
  std::vector<int64_t> waits = {100, 2000000000000, -5};
  const ep::Tensor base32 = random_f32(1, 5, 9), base64 = random_f32(1, 6, 4);  // any bytes
  auto run = [&](integrations::RowBackend& b, ep::Tensor& written, ep::Tensor& sum32,
                 ep::Tensor& sum64) {
    b.write(written.raw(), counts.data(), 4 * counts.size());
    b.write(sum32.raw(), base32.raw(), sum32.bytes());
    b.write(sum64.raw(), base64.raw(), sum64.bytes());
    b.add(sum32, std::span<const int32_t>(counts));
    b.add(sum32, std::span<const int32_t>(counts));
    b.add(sum64, std::span<const int64_t>(waits));
  };
  ep::Tensor got = backend.allocate(ep::DType::i32, 5), got32 = backend.allocate(ep::DType::i32, 5),
             got64 = backend.allocate(ep::DType::i64, 3);
  ep::Tensor want = host.allocate(ep::DType::i32, 5), want32 = host.allocate(ep::DType::i32, 5),
             want64 = host.allocate(ep::DType::i64, 3);
  run(backend, got, got32, got64);
  run(host, want, want32, want64);
  counts.assign(counts.size(), 99);
  waits.assign(waits.size(), 99);
  return compare("written", got, want, backend) + compare("added i32", got32, want32, backend) +
         compare("added i64", got64, want64, backend);
}

}  // namespace proxyep::testing::device_backend_cases
