# CUDA and NCCL are optional and detected at configure time: everything else builds without them.
# scripts/ put the toolkit's bin/ on PATH when it exists in its standard place, so nvcc is found
# the same way here, in CI and on a GPU machine.
option(PROXYEP_ENABLE_CUDA "Build the CUDA targets when a CUDA compiler is found" ON)
set(PROXYEP_HAVE_CUDA OFF)
if(PROXYEP_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90) # Hopper (H100/H200), the GPUs EFA clusters carry
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(PROXYEP_HAVE_CUDA ON)
    find_library(PROXYEP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    message(STATUS "ProxyEP: CUDA ${CMAKE_CUDA_COMPILER_VERSION} found, CUDA targets enabled (NCCL: ${PROXYEP_NCCL_LIBRARY})")
  else()
    message(STATUS "ProxyEP: no CUDA compiler found, CUDA targets disabled")
  endif()
endif()
