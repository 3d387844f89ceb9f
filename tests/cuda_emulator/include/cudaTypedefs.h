// The driver API's function-pointer types that gpu_side/cuda/current_device.hpp names, as the
// emulator (tests/cuda_emulator) spells them. Nothing here is callable: the fake
// cudaGetDriverEntryPointByVersion finds no symbol, so CurrentDevice restores the device number
// with cudaSetDevice instead of the context, as it does where the driver offers no entry point.
#pragma once

struct CUctx_st;
typedef struct CUctx_st* CUcontext;
typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
} CUresult;

typedef CUresult (*PFN_cuCtxGetCurrent_v4000)(CUcontext* context);
typedef CUresult (*PFN_cuCtxSetCurrent_v4000)(CUcontext context);
