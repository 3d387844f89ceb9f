// The CUDA runtime API as the emulator provides it (tests/cuda_emulator): the types with the real
// enum values, and each function the kernels' host code and the GPU tests call, as a static inline
// wrapper over cuemu's fake runtime (runtime/fake_runtime.cpp) or fake driver (runtime/
// fake_driver.cpp: events, capture and graphs, IPC, pointer attributes, peers). Code compiled
// against this header must never also see the toolkit's, and is never linked with libcudart.
// Struct layouts and enum values are the toolkit's as far as the code here reads them.
#pragma once

#include <cstddef>
#include <cstdint>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorSymbolNotFound = 500,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureWrongThread = 908,
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
cudaError_t memcpy_sync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind);
cudaError_t memcpy_async(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t stream);
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
static inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes,
                                     cudaMemcpyKind kind) {
  return cuemu::rt::memcpy_sync(to, from, bytes, kind);
}
static inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  return cuemu::rt::memcpy_async(to, from, bytes, kind, stream);
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

// What fake_driver.cpp provides: events, stream-ordered allocation, pointer attributes, IPC, PCI
// bus ids, peer access, the driver entry points (none), capture modes, capture and graphs.
struct CUevent_st;
typedef struct CUevent_st* cudaEvent_t;
struct CUgraph_st;
typedef struct CUgraph_st* cudaGraph_t;
struct CUgraphExec_st;
typedef struct CUgraphExec_st* cudaGraphExec_t;

constexpr unsigned int cudaEventDefault = 0x0;
constexpr unsigned int cudaEventBlockingSync = 0x1;
constexpr unsigned int cudaEventDisableTiming = 0x2;
constexpr unsigned int cudaEventInterprocess = 0x4;
constexpr unsigned int cudaIpcMemLazyEnablePeerAccess = 0x1;
constexpr unsigned long long cudaEnableDefault = 0x0;

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

#define CUDA_IPC_HANDLE_SIZE 64
typedef struct cudaIpcMemHandle_st {
  char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;

enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaGraphInstantiateFlags {
  cudaGraphInstantiateFlagAutoFreeOnLaunch = 1,
  cudaGraphInstantiateFlagUpload = 2,
  cudaGraphInstantiateFlagDeviceLaunch = 4,
  cudaGraphInstantiateFlagUseNodePriority = 8,
};

namespace cuemu::drv {
cudaError_t event_create(cudaEvent_t* event, unsigned int flags);
cudaError_t event_destroy(cudaEvent_t event);
cudaError_t event_record(cudaEvent_t event, cudaStream_t stream);
cudaError_t event_query(cudaEvent_t event);
cudaError_t event_synchronize(cudaEvent_t event);
cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t malloc_async(void** pointer, size_t bytes, cudaStream_t stream);
cudaError_t free_async(void* pointer, cudaStream_t stream);
cudaError_t pointer_attributes(cudaPointerAttributes* attributes, const void* pointer);
cudaError_t ipc_get_handle(cudaIpcMemHandle_t* handle, void* pointer);
cudaError_t ipc_open_handle(void** pointer, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t ipc_close_handle(void* pointer);
cudaError_t pci_bus_id(char* bus_id, int length, int device);
cudaError_t device_by_pci_bus_id(int* device, const char* bus_id);
cudaError_t can_access_peer(int* can, int device, int peer);
cudaError_t enable_peer_access(int peer, unsigned int flags);
cudaError_t disable_peer_access(int peer);
cudaError_t driver_entry_point(const char* symbol, void** function, unsigned int version,
                               unsigned long long flags, cudaDriverEntryPointQueryResult* result);
cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode);
cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t capture_info(cudaStream_t stream, cudaStreamCaptureStatus* status,
                         unsigned long long* id);
cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t graph_destroy(cudaGraph_t graph);
cudaError_t graph_exec_destroy(cudaGraphExec_t exec);
}  // namespace cuemu::drv

static inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cuemu::drv::event_create(event, cudaEventDefault);
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return cuemu::drv::event_create(event, flags);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return cuemu::drv::event_destroy(event);
}
static inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  return cuemu::drv::event_record(event, stream);
}
static inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  return cuemu::drv::event_query(event);
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return cuemu::drv::event_synchronize(event);
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                              unsigned int flags = 0) {
  return cuemu::drv::stream_wait_event(stream, event, flags);
}
static inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  return cuemu::drv::malloc_async(p, bytes, stream);
}
static inline cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  return cuemu::drv::free_async(p, stream);
}
static inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                   const void* p) {
  return cuemu::drv::pointer_attributes(attributes, p);
}
static inline cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  return cuemu::drv::ipc_get_handle(handle, p);
}
static inline cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle,
                                               unsigned int flags) {
  return cuemu::drv::ipc_open_handle(p, handle, flags);
}
static inline cudaError_t cudaIpcCloseMemHandle(void* p) {
  return cuemu::drv::ipc_close_handle(p);
}
static inline cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
  return cuemu::drv::pci_bus_id(bus_id, length, device);
}
static inline cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* bus_id) {
  return cuemu::drv::device_by_pci_bus_id(device, bus_id);
}
static inline cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  return cuemu::drv::can_access_peer(can, device, peer);
}
static inline cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  return cuemu::drv::enable_peer_access(peer, flags);
}
static inline cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  return cuemu::drv::disable_peer_access(peer);
}
static inline cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** function, unsigned int version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* result = nullptr) {
  return cuemu::drv::driver_entry_point(symbol, function, version, flags, result);
}
static inline cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return cuemu::drv::exchange_capture_mode(mode);
}
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return cuemu::drv::begin_capture(stream, mode);
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  return cuemu::drv::end_capture(stream, graph);
}
static inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                                cudaStreamCaptureStatus* status) {
  return cuemu::drv::capture_info(stream, status, nullptr);
}
static inline cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                   cudaStreamCaptureStatus* status,
                                                   unsigned long long* id = nullptr) {
  return cuemu::drv::capture_info(stream, status, id);
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                               unsigned long long flags = 0) {
  return cuemu::drv::graph_instantiate(exec, graph, flags);
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  return cuemu::drv::graph_launch(exec, stream);
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return cuemu::drv::graph_destroy(graph);
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return cuemu::drv::graph_exec_destroy(exec);
}
