// Signal words and stream capture on a CUDA stream (CudaDevice::wait_value / write_value,
// begin_capture / end_capture / launch): the cases of tests/unit/gpu_side/device/
// device_signal_cases.hpp and device_capture_cases.hpp, which the simulated device also runs.
// Exits 77 (ctest SKIP_RETURN_CODE) with a clear message when no CUDA device is usable.
#include "gpu_side/cuda/cuda_device.hpp"

#include "tests/gpu/device_check.hpp"
#include "tests/unit/gpu_side/device/device_capture_cases.hpp"
#include "tests/unit/gpu_side/device/device_signal_cases.hpp"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

using namespace proxyep;

int main() {
  namespace cases = gpu_side::testing::device_signal;
  namespace capture = gpu_side::testing::device_capture;
  const std::pair<const char*,
                  std::string (*)(const std::shared_ptr<gpu_side::device::DeviceRuntime>&)>
      all[] = {{"wait, then signal", &cases::wait_then_signal_case},
               {"a wait past its deadline", &cases::timed_out_wait_case},
               {"words the GPU cannot use", &cases::refused_words_case},
               {"a step captured once, launched twice", &capture::capture_and_replay_case},
               {"what a graph cannot hold", &capture::refused_in_capture_case}};
  return testing::run_gpu_cases(all, [](const auto& c) {
    const std::string failure = c.second(std::make_shared<gpu_side::cuda::CudaDevice>(0));
    std::printf("%s %s %s\n", failure.empty() ? "ok  " : "FAIL", c.first, failure.c_str());
    return failure.empty();
  });
}
