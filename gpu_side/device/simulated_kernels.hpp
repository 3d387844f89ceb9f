// The host-simulated device's table of EP kernels (ep_kernels.hpp): the CPU twins of the CUDA
// kernels (gpu_side/ep), each queued on a SimulatedDevice's stream after every address it is
// given was checked. Handed out by SimulatedDevice::kernels() only, with the device itself.
#pragma once

#include "gpu_side/device/ep_kernels.hpp"

namespace proxyep::gpu_side::device {

const EpKernels& simulated_kernels();

}  // namespace proxyep::gpu_side::device
