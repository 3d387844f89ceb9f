// The low-latency kernels (gpu_side/cuda/ll_kernels.hpp) against their CPU twins, bit for bit:
// each kernel runs one gpu_side/ep/ll_rules.hpp rule over many items with a thread block per
// item, the twin runs the same rule on HostLanes, and every byte of the output areas (filler
// that no item writes included) must agree:
//   - pack: tokens packed into messages at permuted offsets (some tokens twice), every format;
//   - unpack (ll_counted.hpp): those messages as four sources' slots, placed by random counts
//     into three experts' rows, scales and src_info, with recv_count and layout_range; and the
//     way back: random rows returned to the sources' slots by that layout;
//   - combine: tokens with up to kLlMaxTopk rows, some skipped, weights of both signs;
//   - route (ll_route.hpp): counts, positions and bad selections of a routing with hot experts,
//     drops and out-of-range values, over several chunks of a block and fewer blocks than experts;
//     then the routed pack of x by that routing into every rank's slot, the count of a changed
//     copy's mismatches, and (BF16) the routed combine of rows sent back in that layout with one
//     rank masked.
// Exits 77 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is usable.
#include "common/error.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"
#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/numeric.hpp"

#include "tests/gpu/device_check.hpp"
#include "tests/gpu/device_memory.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;
using proxyep::testing::check_cuda;
using proxyep::testing::DeviceMemory;
using proxyep::testing::first_difference;

namespace {

constexpr std::byte kFiller{0x5a};  // output bytes no item writes keep this value

struct Case {
  std::string name;
  LlFormat format;
  int tokens = 64;
  int topk = 8;
  int blocks = 0, threads = 0;  // 0: the launch functions' defaults
};

bool same(const Case& c, const char* what, const void* host, const void* device, size_t bytes) {
  const int64_t at = first_difference(host, device, bytes);
  if (at < 0) return true;
  std::printf("FAIL %s: %s differs at byte %lld of %zu\n", c.name.c_str(), what,
              static_cast<long long>(at), bytes);
  return false;
}

// bf16 rows whose 128-channel groups have magnitudes from 2^-20 to 2^20, with an all-zero group
// (the amax floor) and a group at bf16's largest values in every row.
std::vector<uint16_t> make_x(std::mt19937_64& rng, int tokens, uint32_t hidden) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<uint16_t> x(static_cast<size_t>(tokens) * hidden);
  for (int t = 0; t < tokens; ++t)
    for (uint32_t g = 0; g < hidden / 128; ++g) {
      uint16_t* group = x.data() + static_cast<size_t>(t) * hidden + g * 128;
      const int e = exponent(rng);
      for (int i = 0; i < 128; ++i)
        group[i] = (g + t) % 7 == 0   ? uint16_t{0}
                   : (g + t) % 7 == 3 ? uint16_t(i % 2 ? 0x7f7f : 0xff7e)
                                      : float_to_bf16(std::ldexp(normal(rng), e));
    }
  return x;
}

// Packs every token once at a permuted slot and the first quarter again at the last slots;
// returns the host messages for the unpack check.
bool check_pack(const Case& c, const std::vector<uint16_t>& x, std::mt19937_64& rng,
                std::vector<std::byte>& messages, int& slots) {
  const LlFormat& f = c.format;
  slots = c.tokens + c.tokens / 4;
  std::vector<int> slot(c.tokens);
  for (int t = 0; t < c.tokens; ++t)
    slot[t] = t;
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<std::pair<uint64_t, int>> placed;  // (message offset, token)
  for (int t = 0; t < c.tokens; ++t)
    placed.push_back({static_cast<uint64_t>(slot[t]) * f.message_bytes(), t});
  for (int t = 0; t < c.tokens / 4; ++t)
    placed.push_back({static_cast<uint64_t>(c.tokens + t) * f.message_bytes(), t});

  messages.assign(static_cast<size_t>(slots) * f.message_bytes(), kFiller);
  for (const auto& [offset, token] : placed)
    ll_pack_message(f, x.data() + static_cast<size_t>(token) * f.hidden, token,
                    messages.data() + offset, HostLanes{});

  DeviceMemory x_d(x.data(), x.size() * 2);
  DeviceMemory out_d(messages.size());
  std::vector<gpu_side::cuda::LlPackItem> items;
  for (const auto& [offset, token] : placed)
    items.push_back({out_d.as<std::byte>() + offset, token});
  DeviceMemory items_d(items.data(), items.size() * sizeof(items[0]));
  check_cuda(cudaMemset(out_d.as<void>(), static_cast<int>(kFiller), messages.size()), "memset");
  gpu_side::cuda::LlPackParams p;
  p.format = f;
  p.x = x_d.as<uint16_t>();
  p.items = items_d.as<gpu_side::cuda::LlPackItem>();
  p.num_items = static_cast<int64_t>(items.size());
  p.blocks = c.blocks;
  if (c.threads > 0) p.threads = c.threads;
  check_cuda(gpu_side::cuda::launch_ll_pack(p, nullptr), "launch_ll_pack");
  check_cuda(cudaDeviceSynchronize(), "ll_pack_kernel");
  return same(c, "packed messages", messages.data(),
              out_d.download<std::byte>(messages.size()).data(), messages.size());
}

// The way back of an unpack's layout (ll_counted.hpp): random bf16 rows of every expert returned
// to four sources' slots (slot_rows each) by `layout_range`, kernel against twin, filler too.
bool check_return(const Case& c, const std::vector<int64_t>& layout_range, int experts, int ranks,
                  int64_t rows, int64_t slot_rows, std::mt19937_64& rng) {
  const uint32_t H = c.format.hidden;
  std::vector<uint16_t> x(static_cast<size_t>(experts * rows) * H);
  for (auto& v : x)
    v = static_cast<uint16_t>(rng());
  const size_t slot_words = static_cast<size_t>(slot_rows) * H;
  std::vector<uint16_t> slots(ranks * slot_words, 0x5a5a);
  DeviceMemory x_d(x.data(), x.size() * 2), range_d(layout_range.data(), layout_range.size() * 8);
  DeviceMemory slots_d(slots.data(), slots.size() * 2);
  std::vector<uint16_t*> host_to, device_to;
  for (int s = 0; s < ranks; ++s) {
    host_to.push_back(slots.data() + s * slot_words);
    device_to.push_back(slots_d.as<uint16_t>() + s * slot_words);
  }
  LlReturnCountedParams p;
  p.layout_range = layout_range.data();
  p.x = x.data();
  p.to = host_to.data();
  p.ranks = ranks;
  p.local_experts = experts;
  p.rows_per_expert = rows;
  p.slot_rows = slot_rows;
  p.hidden = H;
  p.blocks = c.blocks;
  if (c.threads > 0) p.threads = c.threads;
  ll_return_counted_on_host(p);
  DeviceMemory to_d(device_to.data(), device_to.size() * sizeof(void*));
  p.layout_range = range_d.as<int64_t>();
  p.x = x_d.as<uint16_t>();
  p.to = to_d.as<uint16_t*>();
  check_cuda(gpu_side::cuda::launch_ll_return_counted(p, nullptr), "launch_ll_return_counted");
  check_cuda(cudaDeviceSynchronize(), "ll_return_counted_kernel");
  return same(c, "returned rows", slots.data(), slots_d.download<uint16_t>(slots.size()).data(),
              slots.size() * 2);
}

// The messages as four sources' slots (in order, one source empty) unpacked by random counts
// into three experts' outputs, with recv_count and layout_range (ll_counted.hpp); then the way
// back by that layout (check_return).
bool check_unpack(const Case& c, const std::vector<std::byte>& messages, int slots,
                  std::mt19937_64& rng) {
  const LlFormat& f = c.format;
  constexpr int kExperts = 3, kRanks = 4;
  const int64_t rows = slots;  // rows per expert, more than any expert receives
  const uint32_t S = f.scale_words();
  const size_t x_bytes = kExperts * rows * f.payload_bytes();
  const size_t scale_words = kExperts * std::max<size_t>(S, 1) * rows;
  const size_t info_words = kExperts * rows;
  std::vector<std::byte> recv_x(x_bytes, kFiller);
  std::vector<uint32_t> scales(scale_words, 0x5a5a5a5au);
  std::vector<int32_t> src_info(info_words, 0x5a5a5a5a), recv_count(kExperts, 0x5a5a5a5a);
  std::vector<int64_t> layout_range(kExperts * kRanks, 0x5a5a5a5a);

  // Source-major counts: the slots cut at random points, source 1 sends nothing.
  std::vector<int32_t> counts(kExperts * kRanks, 0);
  for (int i = 0; i < slots; ++i) {
    int bucket = static_cast<int>(rng() % (kExperts * kRanks));
    if (bucket / kExperts == 1) bucket += kExperts;
    ++counts[bucket];
  }
  DeviceMemory messages_d(messages.data(), messages.size());
  std::vector<const std::byte*> host_from(kRanks, nullptr), device_from(kRanks, nullptr);
  int64_t first = 0;
  for (int s = 0; s < kRanks; ++s) {
    int64_t sent = 0;
    for (int e = 0; e < kExperts; ++e)
      sent += counts[s * kExperts + e];
    if (sent > 0) {
      host_from[s] = messages.data() + first * f.message_bytes();
      device_from[s] = messages_d.as<std::byte>() + first * f.message_bytes();
    }
    first += sent;
  }
  DeviceMemory x_d(x_bytes), scales_d(scale_words * 4), info_d(info_words * 4);
  DeviceMemory recv_count_d(recv_count.data(), kExperts * 4);
  DeviceMemory range_d(layout_range.data(), layout_range.size() * 8);
  x_d.upload(recv_x.data(), x_bytes);
  scales_d.upload(scales.data(), scale_words * 4);
  info_d.upload(src_info.data(), info_words * 4);
  std::vector<LlExpertSink> host_sinks, device_sinks;
  for (int e = 0; e < kExperts; ++e) {
    host_sinks.push_back({recv_x.data() + e * rows * f.payload_bytes(),
                          scales.data() + e * S * rows, rows, src_info.data() + e * rows});
    device_sinks.push_back({x_d.as<std::byte>() + e * rows * f.payload_bytes(),
                            scales_d.as<uint32_t>() + e * S * rows, rows,
                            info_d.as<int32_t>() + e * rows});
  }
  LlUnpackCountedParams p;
  p.format = f;
  p.counts = counts.data();
  p.from = host_from.data();
  p.sinks = host_sinks.data();
  p.recv_count = recv_count.data();
  p.layout_range = layout_range.data();
  p.ranks = kRanks;
  p.local_experts = kExperts;
  p.rows_per_expert = rows;
  p.blocks = c.blocks;
  if (c.threads > 0) p.threads = c.threads;
  ll_unpack_counted_on_host(p);
  DeviceMemory counts_d(counts.data(), counts.size() * 4);
  DeviceMemory from_d(device_from.data(), device_from.size() * sizeof(void*));
  DeviceMemory sinks_d(device_sinks.data(), device_sinks.size() * sizeof(LlExpertSink));
  p.counts = counts_d.as<int32_t>();
  p.from = from_d.as<const std::byte*>();
  p.sinks = sinks_d.as<LlExpertSink>();
  p.recv_count = recv_count_d.as<int32_t>();
  p.layout_range = range_d.as<int64_t>();
  check_cuda(gpu_side::cuda::launch_ll_unpack_counted(p, nullptr), "launch_ll_unpack_counted");
  check_cuda(cudaDeviceSynchronize(), "ll_unpack_counted_kernel");
  bool ok = same(c, "recv_x", recv_x.data(), x_d.download<std::byte>(x_bytes).data(), x_bytes);
  ok &= same(c, "recv_x_scales", scales.data(), scales_d.download<uint32_t>(scale_words).data(),
             scale_words * 4);
  ok &= same(c, "src_info", src_info.data(), info_d.download<int32_t>(info_words).data(),
             info_words * 4);
  ok &= same(c, "recv_count", recv_count.data(), recv_count_d.download<int32_t>(kExperts).data(),
             kExperts * 4);
  ok &= same(c, "layout_range", layout_range.data(),
             range_d.download<int64_t>(layout_range.size()).data(), layout_range.size() * 8);
  ok &= check_return(c, layout_range, kExperts, kRanks, rows, slots, rng);
  return ok;
}

// Tokens reduce top-k rows of a table of expert outputs; -1 entries are skipped.
bool check_combine(const Case& c, std::mt19937_64& rng) {
  const uint32_t hidden = c.format.hidden;
  const int K = c.topk;
  const int64_t table_rows = 97;
  std::normal_distribution<float> normal;
  std::vector<uint16_t> table(table_rows * hidden);
  for (uint16_t& v : table)
    v = float_to_bf16(normal(rng) * 4.0f);
  std::vector<int64_t> pick(static_cast<size_t>(c.tokens) * K);
  std::vector<float> weights(pick.size());
  for (size_t i = 0; i < pick.size(); ++i) {
    pick[i] = rng() % 5 == 0 ? -1 : static_cast<int64_t>(rng() % table_rows);
    weights[i] = normal(rng);
  }
  DeviceMemory table_d(table.data(), table.size() * 2);
  std::vector<const uint16_t*> host_rows(pick.size()), device_rows(pick.size());
  for (size_t i = 0; i < pick.size(); ++i) {
    host_rows[i] = pick[i] < 0 ? nullptr : table.data() + pick[i] * hidden;
    device_rows[i] = pick[i] < 0 ? nullptr : table_d.as<uint16_t>() + pick[i] * hidden;
  }
  std::vector<uint16_t> out(static_cast<size_t>(c.tokens) * hidden, 0x5a5a);
  for (int t = 0; t < c.tokens; ++t)
    ll_combine_token(host_rows.data() + t * K, weights.data() + t * K, K, hidden,
                     out.data() + static_cast<size_t>(t) * hidden, HostLanes{});
  DeviceMemory rows_d(device_rows.data(), device_rows.size() * sizeof(device_rows[0]));
  DeviceMemory weights_d(weights.data(), weights.size() * 4);
  DeviceMemory out_d(out.size() * 2);
  gpu_side::cuda::LlCombineParams p;
  p.rows = rows_d.as<const uint16_t*>();
  p.weights = weights_d.as<float>();
  p.out = out_d.as<uint16_t>();
  p.num_tokens = c.tokens;
  p.topk = K;
  p.hidden = hidden;
  p.blocks = c.blocks;
  if (c.threads > 0) p.threads = c.threads;
  check_cuda(gpu_side::cuda::launch_ll_combine(p, nullptr), "launch_ll_combine");
  check_cuda(cudaDeviceSynchronize(), "ll_combine_kernel");
  return same(c, "combined", out.data(), out_d.download<uint16_t>(out.size()).data(),
              out.size() * 2);
}

bool check_route(const Case& c, const std::vector<uint16_t>& x, std::mt19937_64& rng) {
  const int32_t experts = c.tokens % 2 == 0 ? 288 : 7;
  const int32_t local = c.tokens % 2 == 0 ? 9 : 7;
  std::vector<int64_t> idx(static_cast<size_t>(c.tokens) * c.topk);
  std::uniform_int_distribution<int64_t> any(0, experts - 1);
  std::uniform_real_distribution<double> u;
  for (int64_t& e : idx) {
    const double p = u(rng);
    e = p < 0.1 ? -1 : p < 0.12 ? experts + any(rng) : p < 0.6 ? any(rng) % 3 : any(rng);
  }
  std::vector<int32_t> counts(static_cast<size_t>(experts)), positions(idx.size());
  int32_t invalid = 0;
  LlRouteParams p{.topk_idx = idx.data(),
                  .num_tokens = c.tokens,
                  .topk = c.topk,
                  .num_experts = experts,
                  .counts = counts.data(),
                  .positions = positions.data(),
                  .invalid = &invalid};
  ll_route_on_host(p);
  DeviceMemory idx_d(idx.data(), idx.size() * 8), counts_d(counts.size() * 4),
      positions_d(positions.size() * 4), invalid_d(4);
  p.topk_idx = idx_d.as<int64_t>();
  p.counts = counts_d.as<int32_t>();
  p.positions = positions_d.as<int32_t>();
  p.invalid = invalid_d.as<int32_t>();
  p.blocks = c.blocks;
  if (c.threads > 0) p.threads = c.threads;
  check_cuda(gpu_side::cuda::launch_ll_route(p, nullptr), "launch_ll_route");
  check_cuda(cudaDeviceSynchronize(), "ll_route_kernel");
  bool ok = same(c, "route counts", counts.data(), counts_d.download<int32_t>(counts.size()).data(),
                 counts.size() * 4);
  ok &= same(c, "route positions", positions.data(),
             positions_d.download<int32_t>(positions.size()).data(), positions.size() * 4);
  ok &= same(c, "route invalid", &invalid, invalid_d.download<int32_t>(1).data(), 4);
  if (!ok) return false;

  // The routed pack: every rank's slot one after another, as many messages as route placed.
  const int ranks = experts / local;
  const uint64_t message = c.format.message_bytes();
  std::vector<uint64_t> first(static_cast<size_t>(ranks) + 1, 0);
  for (int d = 0; d < ranks; ++d) {
    first[d + 1] = first[d];
    for (int e = d * local; e < (d + 1) * local; ++e)
      first[d + 1] += static_cast<uint64_t>(counts[e]);
  }
  std::vector<std::byte> slots(first[ranks] * message, kFiller);
  DeviceMemory x_d(x.data(), x.size() * 2), slots_d(slots.data(), slots.size());
  std::vector<std::byte*> table(static_cast<size_t>(ranks)), table_d_values(table.size());
  for (int d = 0; d < ranks; ++d) {
    table[d] = slots.data() + first[d] * message;
    table_d_values[d] = slots_d.as<std::byte>() + first[d] * message;
  }
  DeviceMemory table_d(table_d_values.data(), table.size() * sizeof(std::byte*));
  LlPackRoutedParams pack{.format = c.format,
                          .x = x.data(),
                          .topk_idx = idx.data(),
                          .positions = positions.data(),
                          .counts = counts.data(),
                          .slots = table.data(),
                          .num_tokens = c.tokens,
                          .topk = c.topk,
                          .num_experts = experts,
                          .local_experts = local};
  ll_pack_routed_on_host(pack);
  pack.x = x_d.as<uint16_t>();
  pack.topk_idx = idx_d.as<int64_t>();
  pack.positions = positions_d.as<int32_t>();
  pack.counts = counts_d.as<int32_t>();
  pack.slots = table_d.as<std::byte*>();
  pack.blocks = c.blocks;
  if (c.threads > 0) pack.threads = c.threads;
  check_cuda(gpu_side::cuda::launch_ll_pack_routed(pack, nullptr), "launch_ll_pack_routed");
  check_cuda(cudaDeviceSynchronize(), "ll_pack_routed_kernel");
  ok = same(c, "routed pack", slots.data(), slots_d.download<std::byte>(slots.size()).data(),
            slots.size());

  // The mismatch count of a combine's topk_idx against this one, three entries changed.
  std::vector<int64_t> other = idx;
  for (size_t i = 0; i < other.size() && i < 3; ++i)
    other[i * other.size() / 3] += 1;
  DeviceMemory other_d(other.data(), other.size() * 8), mismatches_d(4);
  MismatchParams compare{.a = idx.data(),
                         .b = other.data(),
                         .count = static_cast<int64_t>(idx.size()),
                         .mismatches = nullptr};
  int32_t mismatches = -1;
  compare.mismatches = &mismatches;
  count_mismatches_on_host(compare);
  compare.a = idx_d.as<int64_t>();
  compare.b = other_d.as<int64_t>();
  compare.mismatches = mismatches_d.as<int32_t>();
  compare.blocks = c.blocks;
  check_cuda(gpu_side::cuda::launch_count_mismatches(compare, nullptr), "launch_count_mismatches");
  check_cuda(cudaDeviceSynchronize(), "count_mismatches_kernel");
  ok &= same(c, "mismatch count", &mismatches, mismatches_d.download<int32_t>(1).data(), 4);
  if (c.format.fp8) return ok;  // the combine is BF16: once per hidden size

  // The routed combine of rows sent back in the same layout, rank 1 masked (skipped).
  const uint32_t hidden = c.format.hidden;
  std::normal_distribution<float> normal;
  std::vector<uint16_t> back(first[ranks] * hidden);
  for (uint16_t& v : back)
    v = float_to_bf16(normal(rng) * 4.0f);
  std::vector<float> weights(idx.size());
  for (float& w : weights)
    w = normal(rng);
  DeviceMemory back_d(back.data(), back.size() * 2), weights_d(weights.data(), weights.size() * 4);
  std::vector<const uint16_t*> from(static_cast<size_t>(ranks)), from_d_values(from.size());
  for (int d = 0; d < ranks; ++d) {
    const bool masked = d == 1;
    from[d] = masked ? nullptr : back.data() + first[d] * hidden;
    from_d_values[d] = masked ? nullptr : back_d.as<uint16_t>() + first[d] * hidden;
  }
  DeviceMemory from_d(from_d_values.data(), from.size() * sizeof(const uint16_t*));
  std::vector<uint16_t> out(static_cast<size_t>(c.tokens) * hidden, 0x5a5a);
  LlCombineRoutedParams combine{.topk_idx = idx.data(),
                                .positions = positions.data(),
                                .counts = counts.data(),
                                .from = from.data(),
                                .weights = weights.data(),
                                .out = out.data(),
                                .num_tokens = c.tokens,
                                .topk = c.topk,
                                .num_experts = experts,
                                .local_experts = local,
                                .hidden = hidden};
  ll_combine_routed_on_host(combine);
  DeviceMemory out_d(out.size() * 2);
  combine.topk_idx = idx_d.as<int64_t>();
  combine.positions = positions_d.as<int32_t>();
  combine.counts = counts_d.as<int32_t>();
  combine.from = from_d.as<const uint16_t*>();
  combine.weights = weights_d.as<float>();
  combine.out = out_d.as<uint16_t>();
  combine.blocks = c.blocks;
  if (c.threads > 0) combine.threads = c.threads;
  check_cuda(gpu_side::cuda::launch_ll_combine_routed(combine, nullptr),
             "launch_ll_combine_routed");
  check_cuda(cudaDeviceSynchronize(), "ll_combine_routed_kernel");
  ok &= same(c, "routed combine", out.data(), out_d.download<uint16_t>(out.size()).data(),
             out.size() * 2);
  return ok;
}

bool run_case(const Case& c) {
  std::mt19937_64 rng(1234 + c.format.hidden + c.threads);
  const std::vector<uint16_t> x = make_x(rng, c.tokens, c.format.hidden);
  std::vector<std::byte> messages;
  int slots = 0;
  bool ok = check_pack(c, x, rng, messages, slots);
  ok &= check_unpack(c, messages, slots, rng);
  if (!c.format.fp8) ok &= check_combine(c, rng);  // combine is BF16; once per hidden size
  ok &= check_route(c, x, rng);
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", c.name.c_str());
  return ok;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  all.push_back({"fp8, hidden 7168", LlFormat{.hidden = 7168, .fp8 = true}, 128, 8, 0, 0});
  all.push_back({"fp8 round_scale, hidden 7168, 32 threads",
                 LlFormat{.hidden = 7168, .fp8 = true, .round_scale = true}, 64, 8, 0, 32});
  all.push_back({"fp8 UE8M0, hidden 7168 (padded messages)",
                 LlFormat{.hidden = 7168, .fp8 = true, .round_scale = true, .ue8m0 = true}, 96, 8,
                 5, 0});
  all.push_back({"fp8 UE8M0, hidden 2048, 256 threads",
                 LlFormat{.hidden = 2048, .fp8 = true, .round_scale = true, .ue8m0 = true}, 33, 8,
                 0, 256});
  all.push_back({"bf16, hidden 7168, top-8", LlFormat{.hidden = 7168, .fp8 = false}, 128, 8, 0, 0});
  all.push_back({"bf16, hidden 4096, top-11, 3 blocks of 64",
                 LlFormat{.hidden = 4096, .fp8 = false}, 77, kLlMaxTopk, 3, 64});
  all.push_back({"bf16, hidden 128, top-1", LlFormat{.hidden = 128, .fp8 = false}, 5, 1, 0, 32});
  return all;
}

}  // namespace

int main() {
  return proxyep::testing::run_gpu_cases(cases(), run_case);
}
