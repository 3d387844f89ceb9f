// The kernels the GPU test programs reach only through the device backend, and the edges of the
// others, against their CPU twins byte for byte on the emulator: add (int32 and int64, counts
// that leave a partial last block), copy_runs (aligned, unaligned and empty runs, more runs than
// its 1024-block grid), ll_write_bytes (skipped groups, the slot cap), ll_route (-1 and
// out-of-range experts, selections not a multiple of the block, more experts than blocks) and the
// layout at the edge of its shared counters (12288 of them: exactly 48 KiB; 12289: the global
// path). Each under three device sizes (CUEMU_SMS 132, 3 and 1), which set every default grid.
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/tensor.hpp"

#include "tests/gpu/device_memory.hpp"

#include <cuda_runtime_api.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using proxyep::testing::DeviceMemory;

namespace {

constexpr const char* kDeviceSizes[] = {"132", "3", "1"};

void check(cudaError_t status, const char* what) {
  cuda::check_cuda(status, "test_emu_kernels", what);
}

template <typename T>
std::vector<T> download(const DeviceMemory& memory, size_t count) {
  return memory.download<T>(count);
}

template <typename T>
DeviceMemory upload(const std::vector<T>& host) {
  return DeviceMemory(host.data(), host.size() * sizeof(T));
}

// Runs `body` once per device size, the size in the case's name on failure.
template <typename Body>
void for_each_device_size(Body&& body) {
  for (const char* sms : kDeviceSizes) {
    setenv("CUEMU_SMS", sms, 1);
    CAPTURE(sms);
    body();
  }
  unsetenv("CUEMU_SMS");
}

}  // namespace

TEST_CASE("add: int32 and int64, partial last blocks") {
  std::mt19937_64 random(1);
  for_each_device_size([&] {
    for (bool wide : {false, true})
      for (int64_t count : {1, 255, 257, 769, 70001}) {
        CAPTURE(wide);
        CAPTURE(count);
        const size_t width = wide ? 8 : 4;
        std::vector<unsigned char> to(static_cast<size_t>(count) * width), from(to.size());
        for (auto& b : to)
          b = static_cast<unsigned char>(random());
        for (auto& b : from)
          b = static_cast<unsigned char>(random());
        std::vector<unsigned char> expected = to;
        for (int64_t i = 0; i < count; ++i) {
          if (wide) {
            int64_t a, b;
            std::memcpy(&a, &expected[i * 8], 8);
            std::memcpy(&b, &from[i * 8], 8);
            a = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
            std::memcpy(&expected[i * 8], &a, 8);
          } else {
            int32_t a, b;
            std::memcpy(&a, &expected[i * 4], 4);
            std::memcpy(&b, &from[i * 4], 4);
            a = static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
            std::memcpy(&expected[i * 4], &a, 4);
          }
        }
        DeviceMemory to_d = upload(to), from_d = upload(from);
        ep::AddParams p{
            .wide = wide, .to = to_d.as<void>(), .from = from_d.as<void>(), .count = count};
        check(cuda::launch_add(p, nullptr), "launch_add");
        check(cudaDeviceSynchronize(), "add_kernel");
        CHECK(download<unsigned char>(to_d, to.size()) == expected);
      }
  });
}

TEST_CASE("copy_runs: aligned, unaligned and empty runs, more runs than blocks") {
  std::mt19937_64 random(2);
  for_each_device_size([&] {
    for (int64_t num_runs : {1, 7, 1500}) {
      CAPTURE(num_runs);
      // Each run a slice of one source and one destination buffer, at offsets and lengths that
      // cover every case of the kernel's 16-byte test.
      std::vector<ep::CopyRun> runs;
      std::vector<uint64_t> from_at, to_at, lengths;
      uint64_t from_bytes = 0, to_bytes = 0;
      for (int64_t r = 0; r < num_runs; ++r) {
        const uint64_t length =
            r % 5 == 0 ? 0 : (r % 3 == 0 ? 16 * (1 + random() % 40) : 1 + random() % 700);
        const uint64_t skew = r % 4 == 1 ? 1 + random() % 15 : 0;
        from_at.push_back(from_bytes + skew);
        to_at.push_back(to_bytes + (r % 4 == 2 ? 3 : 0));
        lengths.push_back(length);
        from_bytes = (from_at.back() + length + 15) / 16 * 16;
        to_bytes = (to_at.back() + length + 15) / 16 * 16;
      }
      std::vector<unsigned char> source(from_bytes + 16);
      for (auto& b : source)
        b = static_cast<unsigned char>(random());
      std::vector<unsigned char> before(to_bytes + 16, 0xee), expected = before;
      for (int64_t r = 0; r < num_runs; ++r)
        std::memcpy(&expected[to_at[r]], &source[from_at[r]], lengths[r]);
      DeviceMemory source_d = upload(source), out_d = upload(before);
      for (int64_t r = 0; r < num_runs; ++r)
        runs.push_back(
            {out_d.as<std::byte>() + to_at[r], source_d.as<std::byte>() + from_at[r], lengths[r]});
      DeviceMemory runs_d = upload(runs);
      check(cuda::launch_copy_runs({runs_d.as<ep::CopyRun>(), num_runs}, nullptr),
            "launch_copy_runs");
      check(cudaDeviceSynchronize(), "copy_runs_kernel");
      CHECK(download<unsigned char>(out_d, expected.size()) == expected);
    }
  });
}

TEST_CASE("ll_write_bytes: skipped groups, counts at zero and over the slot") {
  std::mt19937_64 random(3);
  for_each_device_size([&] {
    const int32_t group_size = 3;
    const int64_t count = 301;
    std::vector<int32_t> counts(8 * group_size), groups(static_cast<size_t>(count));
    for (auto& c : counts)
      c = static_cast<int32_t>(random() % 40);
    counts[5] = 0;
    counts[6] = 1000;  // more than the slot holds: capped at max_bytes
    for (auto& g : groups)
      g = static_cast<int32_t>(random() % 9) - 1;  // -1: left as it is
    std::vector<Descriptor> writes(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      writes[i].length = 12345;
      writes[i].cookie = static_cast<uint64_t>(i);
      writes[i].op = Op::write_imm;
    }
    ep::SizeWritesParams p;
    p.counts = counts.data();
    p.groups = groups.data();
    p.group_size = group_size;
    p.unit_bytes = 96;
    p.max_bytes = 96 * 50;
    p.count = count;
    p.threads = 64;
    std::vector<Descriptor> expected = writes;
    p.writes = expected.data();
    ep::ll_write_bytes_on_host(p);
    DeviceMemory writes_d = upload(writes), counts_d = upload(counts), groups_d = upload(groups);
    p.writes = writes_d.as<Descriptor>();
    p.counts = counts_d.as<int32_t>();
    p.groups = groups_d.as<int32_t>();
    check(cuda::launch_ll_write_bytes(p, nullptr), "launch_ll_write_bytes");
    check(cudaDeviceSynchronize(), "ll_write_bytes_kernel");
    const std::vector<Descriptor> got = download<Descriptor>(writes_d, writes.size());
    CHECK(std::memcmp(got.data(), expected.data(), got.size() * sizeof(Descriptor)) == 0);
  });
}

TEST_CASE("ll_route: -1 and out-of-range experts, a partial last chunk, more experts than blocks") {
  std::mt19937_64 random(4);
  for_each_device_size([&] {
    for (int threads : {32, 96, 256})
      for (int blocks : {0, 3}) {
        CAPTURE(threads);
        CAPTURE(blocks);
        const int64_t tokens = 77;
        const int topk = 7;  // 539 selections: no multiple of any block size here
        const int32_t experts = 40;
        std::vector<int64_t> topk_idx(static_cast<size_t>(tokens * topk));
        for (auto& e : topk_idx) {
          const uint64_t pick = random() % 20;
          e = pick == 0   ? -1
              : pick == 1 ? experts + 3
              : pick == 2 ? -7
                          : static_cast<int64_t>(random() % 6);
        }
        ep::LlRouteParams p;
        p.topk_idx = topk_idx.data();
        p.num_tokens = tokens;
        p.topk = topk;
        p.num_experts = experts;
        p.blocks = blocks;
        p.threads = threads;
        std::vector<int32_t> counts(experts), positions(topk_idx.size());
        int32_t invalid = -5;
        p.counts = counts.data();
        p.positions = positions.data();
        p.invalid = &invalid;
        ep::ll_route_on_host(p);
        DeviceMemory idx_d = upload(topk_idx), counts_d(counts.size() * 4),
                     positions_d(positions.size() * 4), invalid_d(4);
        p.topk_idx = idx_d.as<int64_t>();
        p.counts = counts_d.as<int32_t>();
        p.positions = positions_d.as<int32_t>();
        p.invalid = invalid_d.as<int32_t>();
        check(cuda::launch_ll_route(p, nullptr), "launch_ll_route");
        check(cudaDeviceSynchronize(), "ll_route_kernel");
        CHECK(download<int32_t>(counts_d, counts.size()) == counts);
        CHECK(download<int32_t>(positions_d, positions.size()) == positions);
        CHECK(download<int32_t>(invalid_d, 1)[0] == invalid);
        CHECK(invalid > 0);
      }
  });
}

TEST_CASE("layout: 12288 counters in shared memory (48 KiB), 12289 in global memory") {
  std::mt19937_64 random(5);
  // 12 ranks of 1023 experts: 12 + 12276 = 12288 counters; with the node counts (one node), 12289.
  const ep::EpShape shape{.num_ranks = 12, .ranks_per_node = 12, .num_experts = 12 * 1023};
  const int ranks = shape.num_ranks;
  for (bool node_counts : {false, true}) {
    CAPTURE(node_counts);
    const int64_t tokens = 600;
    const int topk = 8;
    ep::Tensor topk_idx = ep::Tensor::empty(ep::DType::i64, tokens, topk);
    for (int64_t i = 0; i < tokens * topk; ++i)
      topk_idx.data<int64_t>()[i] =
          random() % 9 == 0 ? -1 : static_cast<int64_t>(random() % shape.num_experts);
    const ep::DispatchLayout host = ep::compute_dispatch_layout(topk_idx, shape);
    DeviceMemory idx_d(topk_idx.raw(), static_cast<size_t>(tokens * topk * 8)),
        per_rank_d(static_cast<size_t>(ranks) * 4), per_node_d(4),
        per_expert_d(static_cast<size_t>(shape.num_experts) * 4),
        in_rank_d(static_cast<size_t>(tokens * ranks));
    cuda::LayoutParams p;
    p.topk_idx = idx_d.as<int64_t>();
    p.num_tokens = tokens;
    p.topk = topk;
    p.shape = shape;
    p.tokens_per_rank = per_rank_d.as<int32_t>();
    p.tokens_per_node = node_counts ? per_node_d.as<int32_t>() : nullptr;
    p.tokens_per_expert = per_expert_d.as<int32_t>();
    p.is_token_in_rank = in_rank_d.as<bool>();
    check(cuda::launch_dispatch_layout(p, nullptr), "launch_dispatch_layout");
    check(cudaDeviceSynchronize(), "dispatch_layout_kernel");
    const std::vector<int32_t> per_rank = download<int32_t>(per_rank_d, static_cast<size_t>(ranks));
    CHECK(std::memcmp(per_rank.data(), host.num_tokens_per_rank.raw(), per_rank.size() * 4) == 0);
    const std::vector<int32_t> per_expert =
        download<int32_t>(per_expert_d, static_cast<size_t>(shape.num_experts));
    CHECK(std::memcmp(per_expert.data(), host.num_tokens_per_expert.raw(), per_expert.size() * 4) ==
          0);
    const std::vector<unsigned char> in_rank =
        download<unsigned char>(in_rank_d, static_cast<size_t>(tokens * ranks));
    CHECK(std::memcmp(in_rank.data(), host.is_token_in_rank.raw(), in_rank.size()) == 0);
    if (node_counts) {  // one node: every token with any expert counts once
      int32_t expected = 0;
      for (int64_t t = 0; t < tokens; ++t)
        for (int k = 0; k < topk; ++k)
          if (topk_idx.data<int64_t>()[t * topk + k] >= 0) {
            ++expected;
            break;
          }
      CHECK(download<int32_t>(per_node_d, 1)[0] == expected);
    }
  }
}
