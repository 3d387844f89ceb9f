// The DeviceBackend on a real GPU (CudaDevice) against the HostBackend, bit for bit: the same
// cases the unit test runs on the host-simulated device (tests/unit/integrations/
// device_backend_cases.hpp). Exits 77 (skipped) without a usable CUDA device.
#include "gpu_side/cuda/cuda_device.hpp"
#include "tests/gpu/device_check.hpp"
#include "tests/unit/integrations/device_backend_cases.hpp"
#include "tests/unit/integrations/device_backend_ll_cases.hpp"

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

using namespace proxyep;
using namespace proxyep::testing::device_backend_cases;

int main() {
  using Case =
      std::pair<const char*,
                std::function<std::string(std::shared_ptr<gpu_side::device::DeviceRuntime>)>>;
  const std::vector<Case> cases = {
      {"layout", layout_case},
      {"pack_rows bf16", [](auto d) { return pack_rows_case(d, false); }},
      {"pack_rows fp8", [](auto d) { return pack_rows_case(d, true); }},
      {"place_routed_rows", place_routed_rows_case},
      {"reduce", reduce_case},
      {"copy_rows, copy_runs and fill", copy_fill_case},
      {"write and add", write_add_case},
      {"ll_pack bf16", [](auto d) { return ll_pack_case(d, false, false); }},
      {"ll_pack fp8", [](auto d) { return ll_pack_case(d, true, false); }},
      {"ll_pack fp8 ue8m0", [](auto d) { return ll_pack_case(d, true, true); }},
      {"ll_unpack_counted bf16", [](auto d) { return ll_unpack_counted_case(d, false); }},
      {"ll_unpack_counted fp8", [](auto d) { return ll_unpack_counted_case(d, true); }},
      {"ll_combine", ll_combine_case},
  };
  return testing::run_gpu_cases(cases, [](const Case& c) {
    const std::string diff = c.second(std::make_shared<gpu_side::cuda::CudaDevice>(0));
    std::printf("%s %s\n%s", diff.empty() ? "ok  " : "FAIL", c.first, diff.c_str());
    return diff.empty();
  });
}
