// The CUDA kernels of this folder as the table of EP kernels (gpu_side/device/ep_kernels.hpp),
// handed out by CudaDevice::kernels() only, with the device itself.
#pragma once

#include "gpu_side/device/ep_kernels.hpp"

namespace proxyep::gpu_side::cuda {

const device::EpKernels& cuda_kernels();

}  // namespace proxyep::gpu_side::cuda
