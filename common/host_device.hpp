// PROXYEP_HOST_DEVICE marks functions shared by CUDA kernels and host code (layout math,
// descriptor and immediate encoding): `__host__ __device__` when nvcc compiles the file, nothing
// otherwise. This header is the one place the macro is defined; include it, never redefine it.
#pragma once

#if defined(__CUDACC__)
#define PROXYEP_HOST_DEVICE __host__ __device__
#else
#define PROXYEP_HOST_DEVICE
#endif
