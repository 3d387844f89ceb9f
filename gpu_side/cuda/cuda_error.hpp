// CUDA status -> proxyep::Error for .cu files. nvcc cannot compile fmt's consteval format
// strings under C++20, so .cu files do not include common/error.hpp; they call this instead,
// compiled by the host compiler.
#pragma once

namespace proxyep::gpu_side::cuda {

// Throws proxyep::Error(phase, "<what> failed: <message>").
[[noreturn]] void raise_cuda_error(const char* phase, const char* what, const char* message);

}  // namespace proxyep::gpu_side::cuda
