// The device a bench rank's tensors live on (`proxyep bench ep --device`): "host" (none: host
// tensors, the CPU backend), "simulated" (the host-simulated device, standing for a GPU whose
// memory the NIC reads: runs the device path end to end and checks it, a smoke test; its times
// are of host threads, not of a GPU) or "cuda" (the
// rank's GPU, local rank modulo the devices visible; only in a build with CUDA).
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::tools {

// The --device choices.
const std::vector<std::string>& bench_device_kinds();

// Null for "host". Throws proxyep::Error(phase) for "cuda" in a build without CUDA or on a
// machine without a usable GPU.
std::shared_ptr<gpu_side::device::DeviceRuntime> make_bench_device(const std::string& kind,
                                                                   int local_rank,
                                                                   std::string_view phase);

}  // namespace proxyep::tools
