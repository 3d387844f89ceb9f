// Host-side entry points of the normal-mode EP kernels (DEEPEP_CONTRACT 2.2, 2.3, 2.5). Each runs
// the same per-token rule as its CPU twin, from the same header:
//   launch_dispatch_layout  layout_rules.hpp   (twin: ep::compute_dispatch_layout)
//   launch_dispatch_rows    row_rules.hpp dispatch_row   (twin: write_row in buffer_rows.hpp)
//   launch_combine          row_rules.hpp combine_token  (twin: combine_tokens in buffer_rows.hpp)
// so a kernel's output equals the twin's bit for bit (tests/gpu/test_gpu_ep.cpp).
//
// Every pointer is a device address (device memory, CUDA-IPC-mapped peer memory or mapped
// pinned host memory). Launches are asynchronous on `stream`; the return value is the launch
// status (cudaErrorInvalidValue for inconsistent parameters, before anything is launched). Plain
// C++ with the CUDA runtime API only, so g++-compiled code can call it.
#pragma once

#include "gpu_side/ep/kernel_params.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proxyep::gpu_side::cuda {

using ep::AddParams;
using ep::ChunkParams;
using ep::CombineParams;
using ep::CopyRunsParams;
using ep::DispatchParams;
using ep::LayoutParams;

// The parameters (gpu_side/ep/kernel_params.hpp) say what each computes.
cudaError_t launch_dispatch_layout(const LayoutParams& params, cudaStream_t stream);
cudaError_t launch_dispatch_rows(const DispatchParams& params, cudaStream_t stream);
cudaError_t launch_dispatch_chunk(const ChunkParams& params, cudaStream_t stream);
cudaError_t launch_combine(const CombineParams& params, cudaStream_t stream);
cudaError_t launch_add(const AddParams& params, cudaStream_t stream);
cudaError_t launch_copy_runs(const CopyRunsParams& params, cudaStream_t stream);

// Throws proxyep::Error(phase, "<what> failed: <CUDA message>") unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* phase, const char* what);

}  // namespace proxyep::gpu_side::cuda
