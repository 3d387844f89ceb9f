// The CUDA runtime API as the emulator provides it (tests/cuda_emulator): the types with the real
// enum values, and each function the kernels' host code and the GPU tests call, as a static inline
// wrapper over cuemu's fake runtime (runtime/fake_runtime.cpp). Code compiled against this header
// must never also see the toolkit's, and is never linked with libcudart.
#pragma once

#include <cstddef>
#include <cstdint>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
struct uint3 {
  unsigned int x, y, z;
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMultiProcessorCount = 16,
};

constexpr unsigned int cudaStreamDefault = 0x0;
constexpr unsigned int cudaStreamNonBlocking = 0x1;
constexpr unsigned int cudaHostRegisterDefault = 0x0;
constexpr unsigned int cudaHostRegisterPortable = 0x1;
constexpr unsigned int cudaHostRegisterMapped = 0x2;
constexpr unsigned int cudaHostAllocDefault = 0x0;
constexpr unsigned int cudaHostAllocPortable = 0x1;
constexpr unsigned int cudaHostAllocMapped = 0x2;

struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  int maxThreadsPerBlock;
  size_t sharedMemPerBlock;
  int major, minor;
  int pciBusID, pciDeviceID, pciDomainID;
};

namespace cuemu::rt {
cudaError_t get_last_error(bool clear);
const char* error_string(cudaError_t status);
const char* error_name(cudaError_t status);
cudaError_t malloc_device(void** pointer, size_t bytes);
cudaError_t free_device(void* pointer);
cudaError_t malloc_host(void** pointer, size_t bytes);
cudaError_t free_host(void* pointer);
cudaError_t host_register(void* pointer, size_t bytes);
cudaError_t host_unregister(void* pointer);
cudaError_t host_device_pointer(void** device, void* host);
cudaError_t memcpy_sync(void* to, const void* from, size_t bytes);
cudaError_t memcpy_async(void* to, const void* from, size_t bytes, cudaStream_t stream);
cudaError_t memset_sync(void* to, int value, size_t bytes);
cudaError_t memset_async(void* to, int value, size_t bytes, cudaStream_t stream);
cudaError_t get_device_count(int* count);
cudaError_t set_device(int device);
cudaError_t get_device(int* device);
cudaError_t device_attribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t device_properties(cudaDeviceProp* properties, int device);
cudaError_t device_synchronize();
cudaError_t stream_create(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_destroy(cudaStream_t stream);
cudaError_t stream_synchronize(cudaStream_t stream);
cudaError_t stream_query(cudaStream_t stream);
cudaError_t occupancy(int* blocks, int threads, size_t shared_bytes);
}  // namespace cuemu::rt

static inline cudaError_t cudaGetLastError() {
  return cuemu::rt::get_last_error(true);
}
static inline cudaError_t cudaPeekAtLastError() {
  return cuemu::rt::get_last_error(false);
}
static inline const char* cudaGetErrorString(cudaError_t s) {
  return cuemu::rt::error_string(s);
}
static inline const char* cudaGetErrorName(cudaError_t s) {
  return cuemu::rt::error_name(s);
}
static inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  return cuemu::rt::malloc_device(p, bytes);
}
template <typename T>
static inline cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cuemu::rt::malloc_device(reinterpret_cast<void**>(p), bytes);
}
static inline cudaError_t cudaFree(void* p) {
  return cuemu::rt::free_device(p);
}
static inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cuemu::rt::malloc_host(p, bytes);
}
static inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  return cuemu::rt::malloc_host(p, bytes);
}
static inline cudaError_t cudaFreeHost(void* p) {
  return cuemu::rt::free_host(p);
}
static inline cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  return cuemu::rt::host_register(p, bytes);
}
static inline cudaError_t cudaHostUnregister(void* p) {
  return cuemu::rt::host_unregister(p);
}
static inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int) {
  return cuemu::rt::host_device_pointer(device, host);
}
static inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) {
  return cuemu::rt::memcpy_sync(to, from, bytes);
}
static inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind,
                                          cudaStream_t stream = nullptr) {
  return cuemu::rt::memcpy_async(to, from, bytes, stream);
}
static inline cudaError_t cudaMemset(void* to, int value, size_t bytes) {
  return cuemu::rt::memset_sync(to, value, bytes);
}
static inline cudaError_t cudaMemsetAsync(void* to, int value, size_t bytes,
                                          cudaStream_t stream = nullptr) {
  return cuemu::rt::memset_async(to, value, bytes, stream);
}
static inline cudaError_t cudaGetDeviceCount(int* count) {
  return cuemu::rt::get_device_count(count);
}
static inline cudaError_t cudaSetDevice(int device) {
  return cuemu::rt::set_device(device);
}
static inline cudaError_t cudaGetDevice(int* device) {
  return cuemu::rt::get_device(device);
}
static inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  return cuemu::rt::device_attribute(value, attribute, device);
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  return cuemu::rt::device_properties(properties, device);
}
static inline cudaError_t cudaDeviceSynchronize() {
  return cuemu::rt::device_synchronize();
}
static inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cuemu::rt::stream_create(stream, cudaStreamDefault);
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cuemu::rt::stream_create(stream, flags);
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return cuemu::rt::stream_destroy(stream);
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return cuemu::rt::stream_synchronize(stream);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return cuemu::rt::stream_query(stream);
}
// The emulator keeps every block of a launch it must (runtime/scheduler.cpp admits blocks while
// the resident ones only wait), so the answer is a fixed per-SM figure, not the kernel's.
template <typename Kernel>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel,
                                                                        int threads,
                                                                        size_t shared_bytes) {
  return cuemu::rt::occupancy(blocks, threads, shared_bytes);
}
