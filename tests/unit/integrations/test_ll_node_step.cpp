// LlNodeDispatch and LlNodeCombine (integrations/low_latency/ll_node_dispatch.hpp,
// ll_node_combine.hpp) on the host-simulated device: a node's ranks as streams of one device,
// queued and captured, in every format; the plans they refuse, naming what is wrong; a peer that
// never steps.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "integrations/low_latency/ll_node_combine.hpp"
#include "integrations/low_latency/ll_node_dispatch.hpp"
#include "tests/unit/integrations/ll_node_cases.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

using namespace proxyep;
using namespace proxyep::gpu_side;
using device::SimulatedDevice;
using device::SimulatedDeviceOptions;
namespace node_step = proxyep::integrations::low_latency;
using namespace std::chrono_literals;

namespace {

namespace cases = testing::ll_node;

ep::LlFormat format(uint32_t hidden, bool fp8, bool ue8m0) {
  ep::LlFormat f;
  f.hidden = hidden;
  f.fp8 = fp8;
  f.round_scale = ue8m0;
  f.ue8m0 = ue8m0;
  return f;
}

// A plan of rank 0 of 2 over one allocation at `base`: BF16 rows of 128, the tensors at fixed
// offsets; the caller sets the step memory and the epoch.
node_step::LlNodeDispatchPlan small_plan(std::byte* base, int32_t local_experts, int64_t max_tokens,
                                         int64_t num_tokens, int topk) {
  node_step::LlNodeDispatchPlan p;
  p.rank = 0;
  p.ranks = 2;
  p.local_experts = local_experts;
  p.format = format(128, false, false);
  p.max_tokens = max_tokens;
  p.num_tokens = num_tokens;
  p.topk = topk;
  p.slot_bytes = node_step::ll_node_slot_bytes(p.format, p.max_tokens, p.local_experts);
  p.timeout = 1s;
  p.x = reinterpret_cast<const uint16_t*>(base + 20000);
  p.topk_idx = reinterpret_cast<const int64_t*>(base + 30000);
  p.recv_x = base + 32000;
  p.src_info = reinterpret_cast<int32_t*>(base + 40000);
  p.recv_count = reinterpret_cast<int32_t*>(base + 41000);
  p.layout_range = reinterpret_cast<int64_t*>(base + 42000);
  return p;
}

}  // namespace

TEST_CASE("LL node steps: queued and replayed, dispatch and combine are exact on every rank") {
  for (const bool capture : {false, true}) {
    CAPTURE(capture);
    CHECK(cases::node_step_case(std::make_shared<SimulatedDevice>(),
                                {.format = format(128, false, false), .capture = capture}) == "");
    CHECK(cases::node_step_case(std::make_shared<SimulatedDevice>(),
                                {.format = format(512, true, false),
                                 .ranks = 2,
                                 .local_experts = 3,
                                 .max_tokens = 6,
                                 .topk = 4,
                                 .capture = capture}) == "");
    CHECK(cases::node_step_case(std::make_shared<SimulatedDevice>(),
                                {.format = format(512, true, true),
                                 .ranks = 4,
                                 .local_experts = 1,
                                 .max_tokens = 5,
                                 .topk = 2,
                                 .capture = capture}) == "");
  }
  // A slow stream: the others wait for its words rather than run ahead.
  CHECK(cases::node_step_case(
            std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.operation_delay = 1ms}),
            {.format = format(128, false, false), .capture = true}) == "");
}

TEST_CASE("LL node steps: a plan that does not fit is refused, naming what") {
  auto dev = std::make_shared<SimulatedDevice>();
  auto memory = dev->allocate(1 << 16);
  std::byte* base = memory.get();
  auto* words = reinterpret_cast<uint64_t*>(base + 60000);
  const node_step::LlNodeMemory mine{.slots = base,
                                     .counts = reinterpret_cast<int32_t*>(base + 50000),
                                     .arrived = words,
                                     .released = words + 2};
  auto plan = [&] {
    node_step::LlNodeDispatchPlan p = small_plan(base, 2, 4, 4, 2);
    p.memory = {mine, mine};
    p.epoch = words + 4;
    return p;
  };
  auto refusal = [&](auto&& change) {
    node_step::LlNodeDispatchPlan p = plan();
    change(p);
    try {
      node_step::LlNodeDispatch step(dev, std::move(p), "test plan");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal([](auto&) {}).empty());
  CHECK(refusal([](auto& p) { p.slot_bytes -= 16; }).find("slots of") != std::string::npos);
  CHECK(refusal([](auto& p) { p.num_tokens = 5; }).find("5 tokens") != std::string::npos);
  CHECK(refusal([](auto& p) { p.memory.pop_back(); }).find("the memory of 1 ranks") !=
        std::string::npos);
  CHECK(refusal([](auto& p) {
          p.memory[1].arrived = nullptr;
        }).find("rank 1's step memory is missing") != std::string::npos);
  CHECK(refusal([](auto& p) {
          p.memory[1].released =
              reinterpret_cast<uint64_t*>(reinterpret_cast<std::byte*>(p.memory[1].released) + 4);
        }).find("misaligned") != std::string::npos);
  CHECK(refusal([](auto& p) { p.format.hidden = 100; }).find("the format") != std::string::npos);
  CHECK(refusal([](auto& p) { p.timeout = 0ms; }).find("timeout") != std::string::npos);
  CHECK(refusal([](auto& p) { p.recv_x = nullptr; }).find("missing") != std::string::npos);
  CHECK(refusal([](auto& p) { p.rank = 2; }).find("rank 2 is not in") != std::string::npos);

  // The combine's plan, against the dispatch's.
  node_step::LlNodeDispatch dispatch(dev, plan(), "test plan");
  auto combine_plan = [&] {
    node_step::LlNodeCombinePlan p;
    p.slot_bytes = node_step::ll_node_return_slot_bytes(128, 4, 2);
    const node_step::LlNodeReturnMemory back{
        .slots = base + 8192, .arrived = words + 6, .released = words + 8};
    p.memory = {back, back};
    p.epoch = words + 10;
    p.x = reinterpret_cast<const uint16_t*>(base + 20000);
    p.topk_weights = reinterpret_cast<const float*>(base + 30000);
    p.out = reinterpret_cast<uint16_t*>(base + 40000);
    return p;
  };
  auto combine_refusal = [&](auto&& change) {
    node_step::LlNodeCombinePlan p = combine_plan();
    change(p);
    try {
      node_step::LlNodeCombine step(dev, dispatch, std::move(p), "test plan");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(combine_refusal([](auto&) {}).empty());
  CHECK(combine_refusal([](auto& p) { p.slot_bytes -= 16; }).find("return slots of") !=
        std::string::npos);
  CHECK(combine_refusal([](auto& p) {
          p.memory.pop_back();
        }).find("the return memory of 1 ranks") != std::string::npos);
  CHECK(combine_refusal([](auto& p) {
          p.memory[0].slots = nullptr;
        }).find("rank 0's return memory is missing") != std::string::npos);
  CHECK(combine_refusal([](auto& p) { p.topk_weights = nullptr; }).find("missing") !=
        std::string::npos);
}

TEST_CASE("LL node steps: a rank whose peer never steps fails its stream in time, naming it") {
  // Two ranks, only rank 0 steps: its wait for rank 1's messages runs out, naming the phase.
  auto dev = std::make_shared<SimulatedDevice>();
  auto memory = dev->allocate(1 << 16);
  dev->fill(memory.get(), 0, 1 << 16);
  std::byte* base = memory.get();
  auto words_of = [&](int r) { return reinterpret_cast<uint64_t*>(base + 60000 + 64 * r); };
  node_step::LlNodeDispatchPlan p = small_plan(base, 1, 2, 0, 1);
  for (int r = 0; r < 2; ++r)
    p.memory.push_back({.slots = base + 8192 * r,
                        .counts = reinterpret_cast<int32_t*>(base + 50000 + 64 * r),
                        .arrived = words_of(r),
                        .released = words_of(r) + 2});
  p.epoch = words_of(0) + 4;
  p.timeout = 200ms;
  node_step::LlNodeDispatch step(dev, std::move(p), "test");
  step.queue("lonely step");
  std::string error;
  try {
    dev->synchronize("test", 5s);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find("wait_value (lonely step)") != std::string::npos);
  CHECK(error.find("holds 0, not 1") != std::string::npos);
}
