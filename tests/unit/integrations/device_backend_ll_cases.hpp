// The DeviceBackend's low-latency operations (ll_pack, ll_unpack_counted, ll_combine) against the
// HostBackend's, byte for byte, on any DeviceRuntime: the host-simulated device in the unit test
// (tests/unit/integrations/test_device_backend.cpp), CUDA in the GPU test
// (tests/gpu/test_gpu_backend.cpp). Messages sit where the LL protocol puts them: in a slot
// arena (registered host memory); the rows a combine reduces partly there, partly in device
// memory.
#pragma once

#include "tests/unit/integrations/device_backend_cases.hpp"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace proxyep::testing::device_backend_cases {

inline ep::LlFormat ll_format(bool fp8, bool ue8m0) {
  ep::LlFormat f;
  f.hidden = 1024;
  f.fp8 = fp8;
  f.round_scale = ue8m0;
  f.ue8m0 = ue8m0;
  return f;
}

// Dispatch, sender: tokens (some twice, out of order) packed at scattered message offsets.
inline std::string ll_pack_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device, bool fp8,
                                bool ue8m0) {
  DeviceBackend backend(device);
  HostBackend host(2);
  const ep::LlFormat f = ll_format(fp8, ue8m0);
  const int64_t tokens = 9;
  const ep::Tensor x = random_bf16(tokens, f.hidden, fp8 ? 21 : 22);
  const ep::Tensor x_device = to_device(backend, x);
  const uint64_t message = f.message_bytes();
  const std::vector<int32_t> order = {3, 0, 8, 3, 5, 1, 7, 7, 2, 6, 4};
  const uint64_t bytes = order.size() * message;
  Arena got(*device, bytes, 0xcd);
  std::vector<std::byte> want(bytes, std::byte{0xcd});
  // Reversed slots: the addresses are used.
  auto items_at = [&](std::byte* base) {
    std::vector<ep::LlPackItem> items;
    for (size_t i = 0; i < order.size(); ++i)
      items.push_back({.message = base + (order.size() - 1 - i) * message, .token = order[i]});
    return items;
  };
  std::vector<ep::LlPackItem> items = items_at(got.device());
  backend.ll_pack(f, x_device, items);
  host.ll_pack(f, x, items_at(want.data()));
  items.assign(items.size(), {});  // taken with the call
  backend.complete("test");
  return compare(fp8 ? (ue8m0 ? "ll messages fp8 ue8m0" : "ll messages fp8") : "ll messages bf16",
                 got.host(), want.data(), bytes);
}

// Dispatch, receiver: three sources' messages in an arena (one source sends nothing) unpacked by
// their counts into two experts' outputs, with recv_count and layout_range.
inline std::string ll_unpack_counted_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                                          bool fp8) {
  DeviceBackend backend(device);
  HostBackend host(2);
  const ep::LlFormat f = ll_format(fp8, false);
  const int32_t ranks = 3, experts = 2;
  const int64_t tokens = 4, rows = ranks * tokens;  // rows per expert
  // Source-major: source 1 sends nothing, source 2 fills expert 1 and sends expert 0 one.
  const std::vector<int32_t> counts = {3, 2, /**/ 0, 0, /**/ 1, 4};
  const int64_t messages[] = {5, 0, 5};
  const ep::Tensor x = random_bf16(10, f.hidden, 31);
  const uint64_t message = f.message_bytes();
  Arena arena(*device, 10 * message, 0);
  std::vector<ep::LlPackItem> packed;
  for (int32_t t = 0; t < 10; ++t)
    packed.push_back({.message = arena.host() + static_cast<uint64_t>(t) * message, .token = t});
  host.ll_pack(f, x, packed);
  // Source 2's messages first in the arena: the addresses are used.
  auto from_at = [&](const std::byte* base) {
    return std::vector<const std::byte*>{base + messages[2] * message, nullptr, base};
  };

  const auto scale_words = static_cast<int64_t>(f.scale_words());
  auto outputs = [&](integrations::RowBackend& b) {
    std::vector<ep::Tensor> t;
    t.push_back(b.allocate(ep::DType::u8, experts * rows, f.payload_bytes()));
    t.push_back(scale_words > 0 ? b.allocate(ep::DType::f32, experts * scale_words, rows)
                                : ep::Tensor());
    t.push_back(b.allocate(ep::DType::i32, experts, rows));
    t.push_back(b.allocate(ep::DType::i32, experts));
    t.push_back(b.allocate(ep::DType::i64, experts, ranks));
    return t;
  };
  std::vector<ep::Tensor> got = outputs(backend), want = outputs(host);
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].defined()) {
      backend.fill(got[i].raw(), 0xee, got[i].bytes());
      std::memset(want[i].raw(), 0xee, want[i].bytes());
    }
  auto sinks_of = [&](std::vector<ep::Tensor>& t) {
    std::vector<ep::LlExpertSink> sinks;
    for (int e = 0; e < experts; ++e)
      sinks.push_back(
          {.x = t[0].raw() + static_cast<uint64_t>(e * rows) * f.payload_bytes(),
           .scales = t[1].defined() ? t[1].data<uint32_t>() + e * scale_words * rows : nullptr,
           .scale_stride = rows,
           .src_info = t[2].data<int32_t>() + e * rows});
    return sinks;
  };
  backend.ll_unpack_counted(f, counts, from_at(arena.device()), sinks_of(got), rows,
                            got[3].data<int32_t>(), got[4].data<int64_t>());
  host.ll_unpack_counted(f, counts, from_at(arena.host()), sinks_of(want), rows,
                         want[3].data<int32_t>(), want[4].data<int64_t>());
  std::string diff;
  const char* names[] = {"recv_x", "recv_x_scales", "src_info", "recv_count", "layout_range"};
  for (size_t i = 0; i < got.size(); ++i)
    diff += compare(names[i], got[i], want[i], backend);
  // The host backend's outputs as the rule says: expert 1's rows are source 0's two, then
  // source 2's four; its layout_range entries (first row << 32) | count.
  if (want[3].data<int32_t>()[1] != 6 || want[4].data<int64_t>()[5] != ((int64_t{2} << 32) | 4))
    diff += "the host backend's recv_count or layout_range is not the rule's\n";
  return diff;
}

// Combine, home rank: each token's topk rows, some in an arena, some in device memory, some
// missing (null), weighted and reduced.
inline std::string ll_combine_case(std::shared_ptr<gpu_side::device::DeviceRuntime> device) {
  DeviceBackend backend(device);
  HostBackend host(2);
  const int64_t tokens = 7;
  const int topk = 3;
  const uint32_t hidden = 256;
  const uint64_t row_bytes = 2ull * hidden;
  const ep::Tensor arena_rows = random_bf16(5, hidden, 41),
                   device_rows = random_bf16(4, hidden, 42);
  Arena arena(*device, 5 * row_bytes, 0);
  std::memcpy(arena.host(), arena_rows.raw(), 5 * row_bytes);
  const ep::Tensor device_rows_d = to_device(backend, device_rows);
  const ep::Tensor weights = random_f32(tokens, topk, 3);
  const ep::Tensor weights_d = to_device(backend, weights);
  auto table = [&](const std::byte* arena_base, const ep::Tensor& in_device) {
    std::vector<const uint16_t*> rows;
    for (int64_t t = 0; t < tokens; ++t)
      for (int k = 0; k < topk; ++k) {
        const int64_t pick = (t * 3 + k * 5) % 11;
        if (pick >= 9)
          rows.push_back(nullptr);
        else if (pick < 5)
          rows.push_back(reinterpret_cast<const uint16_t*>(arena_base + pick * row_bytes));
        else
          rows.push_back(in_device.data<uint16_t>() + (pick - 5) * hidden);
      }
    return rows;
  };
  ep::Tensor out_d = backend.allocate(ep::DType::bf16, tokens, hidden);
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, tokens, hidden);
  backend.ll_combine(table(arena.device(), device_rows_d), weights_d.data<float>(),
                     out_d.data<uint16_t>(), topk, hidden);
  host.ll_combine(table(arena.host(), device_rows), weights.data<float>(), out.data<uint16_t>(),
                  topk, hidden);
  return compare("ll combined_x", out_d, out, backend);
}

}  // namespace proxyep::testing::device_backend_cases
