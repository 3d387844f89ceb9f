// Host-side entry points of the low-latency (LL) EP kernels (DEEPEP_CONTRACT 2.7, 2.8), with the
// parameters of gpu_side/ep/ll_kernel_params.hpp. Each runs one rule of gpu_side/ep/ll_rules.hpp
// over many items, one thread block per item at a time (BlockLanes), so a kernel's output equals
// the CPU twin's (the same rule on HostLanes) bit for bit (tests/gpu/test_gpu_ll.cpp). Launches are
// asynchronous on `stream`; the return value is the launch status (cudaErrorInvalidValue for
// inconsistent parameters, before anything is launched). Plain C++ with the CUDA runtime API only,
// so g++-compiled code can call it.
#pragma once

#include "gpu_side/ep/ll_kernel_params.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace proxyep::gpu_side::cuda {

// The parameter structs are the device-neutral ones the DeviceRuntime takes.
using ep::LlCombineParams;
using ep::LlCombineRoutedParams;
using ep::LlPackItem;
using ep::LlPackParams;
using ep::LlPackRoutedParams;
using ep::LlReturnCountedParams;
using ep::LlRouteParams;
using ep::LlUnpackCountedParams;
using ep::MismatchParams;
using ep::SizeWritesParams;

cudaError_t launch_ll_pack(const LlPackParams& params, cudaStream_t stream);
cudaError_t launch_ll_combine(const LlCombineParams& params, cudaStream_t stream);
// ll_route.cu: counts and positions of gpu_side/ep/ll_route.hpp's rule (zeroes *invalid first).
cudaError_t launch_ll_route(const LlRouteParams& params, cudaStream_t stream);
// ll_route.cu: every selection packed where ll_route placed it (ll_kernel_params.hpp).
cudaError_t launch_ll_pack_routed(const LlPackRoutedParams& params, cudaStream_t stream);
// ll_route.cu: every token combined from the rows ll_route's output finds (ll_kernel_params.hpp).
cudaError_t launch_ll_combine_routed(const LlCombineRoutedParams& params, cudaStream_t stream);
// ll_counted.cu: every source's messages unpacked by the counts alone, with recv_count and
// layout_range (gpu_side/ep/ll_counted.hpp).
cudaError_t launch_ll_unpack_counted(const LlUnpackCountedParams& params, cudaStream_t stream);
// ll_counted.cu: a combine's rows sent back to their sources by the dispatch's layout_range
// (gpu_side/ep/ll_counted.hpp).
cudaError_t launch_ll_return_counted(const LlReturnCountedParams& params, cudaStream_t stream);
// ll_counted.cu: a step's writes to other nodes sized by its counts (gpu_side/ep/ll_counted.hpp).
cudaError_t launch_ll_write_bytes(const SizeWritesParams& params, cudaStream_t stream);
// ll_route.cu: how many elements of two arrays differ (zeroes *mismatches first).
cudaError_t launch_count_mismatches(const MismatchParams& params, cudaStream_t stream);

}  // namespace proxyep::gpu_side::cuda
