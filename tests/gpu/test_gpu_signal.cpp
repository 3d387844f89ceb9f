// Signal words and stream capture on a CUDA stream (CudaDevice::wait_value / write_value /
// add_value, begin_capture / end_capture / launch), and the node's LL dispatch and combine steps
// built on them (LlNodeDispatch, LlNodeCombine: ranks as streams of the one GPU, queued and
// replayed from graphs): the cases of tests/unit/gpu_side/device/device_signal_cases.hpp,
// device_capture_cases.hpp and ll_node_cases.hpp, which the simulated device also runs.
// Exits 77 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is usable.
#include "gpu_side/cuda/cuda_device.hpp"

#include "tests/gpu/device_check.hpp"
#include "tests/unit/gpu_side/device/device_capture_cases.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"
#include "tests/unit/integrations/ll_node_cases.hpp"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

using namespace proxyep;

namespace {

template <bool kFp8, bool kCapture>
std::string node_step(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device) {
  gpu_side::testing::ll_node::NodeCase c;
  c.format.hidden = kFp8 ? 2048 : 1024;
  c.format.fp8 = kFp8;
  c.ranks = 4;
  c.local_experts = 3;
  c.max_tokens = 32;
  c.topk = 6;
  c.capture = kCapture;
  return gpu_side::testing::ll_node::node_step_case(device, c);
}

}  // namespace

int main() {
  namespace cases = gpu_side::testing::device_signal;
  namespace capture = gpu_side::testing::device_capture;
  const std::pair<const char*,
                  std::string (*)(const std::shared_ptr<gpu_side::device::DeviceRuntime>&)>
      all[] = {
          {"wait, then signal", &cases::wait_then_signal_case},
          {"a wait past its deadline", &cases::timed_out_wait_case},
          {"words the GPU cannot use", &cases::refused_words_case},
          {"a step captured once, launched twice", &capture::capture_and_replay_case},
          {"what a graph cannot hold", &capture::refused_in_capture_case},
          {"a stream joins another's capture", &capture::joined_capture_case},
          {"captured handshakes replayed with epoch values", &capture::replayed_handshake_case},
          {"the node's LL steps, queued", &node_step<false, false>},
          {"the node's LL steps, replayed (BF16)", &node_step<false, true>},
          {"the node's LL steps, replayed (FP8)", &node_step<true, true>}};
  return testing::run_gpu_cases(all, [](const auto& c) {
    const std::string failure = c.second(std::make_shared<gpu_side::cuda::CudaDevice>(0));
    std::printf("%s %s %s\n", failure.empty() ? "ok  " : "FAIL", c.first, failure.c_str());
    return failure.empty();
  });
}
