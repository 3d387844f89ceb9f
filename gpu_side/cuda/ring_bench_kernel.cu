#include "gpu_side/cuda/device_compat.cuh"
#include "gpu_side/cuda/ring_bench_kernel.hpp"
#include "gpu_side/cuda/ring_producer.cuh"

#include "gpu_side/cuda/cuda_error.hpp"

#include <cuda_runtime.h>

#include <string>

namespace proxyep::gpu_side::cuda {
namespace {

constexpr const char* kPhase = "gpu_side.ring_bench_kernel";
// A throughput thread reads the stop word (a PCIe round trip) once per this many pushes only.
constexpr uint64_t kStopCheckEvery = 64;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) raise_cuda_error(kPhase, what, cudaGetErrorString(status));
}

using SystemWord = ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>;

enum class Wait { reached, stopped, timed_out };

// Polls `word` until it holds `wanted`, `stop_word` holds `stop_value` (the same word may be
// both: one read per poll), or timeout_ns passed. acquire (system scope): pairs with the host's
// release stores of start, stop and go (tools/bench/ring_gpu_bench.cpp). No sleep between polls
// where latency is measured: each poll is a PCIe round trip already.
__device__ Wait wait_for(uint64_t& word, uint64_t wanted, uint64_t& stop_word, uint64_t stop_value,
                         uint64_t timeout_ns, bool sleep) {
  const uint64_t start = global_timer_ns();
  for (;;) {
    const uint64_t value = SystemWord(word).load(::cuda::memory_order_acquire);
    if (value == wanted) return Wait::reached;
    const uint64_t stop =
        &stop_word == &word ? value : SystemWord(stop_word).load(::cuda::memory_order_acquire);
    if (stop == stop_value) return Wait::stopped;
    if (global_timer_ns() - start > timeout_ns) return Wait::timed_out;
    if (sleep) __nanosleep(100);
  }
}

__device__ void arrive(RingBenchControl* control) {
  // relaxed: only counted; atomic among this GPU's threads, which is all the host needs
  // (it reads the total, never adds to it).
  SystemWord(control->arrived.value).fetch_add(1, ::cuda::memory_order_relaxed);
}

__global__ void throughput_kernel(DeviceRing ring, RingBenchControl* control, uint64_t ops,
                                  uint64_t timeout_ns, unsigned long long* gave_up) {
  PROXYEP_SHARED(bool, started);
  if (threadIdx.x == 0) {
    arrive(control);
    const Wait wait =
        wait_for(control->start.value, 1, control->stop.value, 1, timeout_ns, /*sleep=*/true);
    if (wait == Wait::timed_out) atomicAdd(gave_up, 1ull);
    started = wait == Wait::reached;
  }
  __syncthreads();
  if (!started) return;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  uint64_t pushes = 0;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < ops; i += stride) {
    // relaxed: the host's abort needs no payload, only the word.
    if (++pushes % kStopCheckEvery == 0 &&
        SystemWord(control->stop.value).load(::cuda::memory_order_relaxed) != 0)
      return;
    if (!device_push(ring, ring_bench_descriptor(i), timeout_ns)) {
      atomicAdd(gave_up, 1ull);
      return;
    }
  }
}

__global__ void latency_kernel(DeviceRing ring, RingBenchControl* control, uint64_t samples,
                               uint64_t timeout_ns, unsigned long long* gave_up) {
  arrive(control);
  uint64_t& go = control->go.value;
  for (uint64_t i = 0; i < samples; ++i) {
    Wait wait = wait_for(go, 2 * i + 1, go, kGoStop, timeout_ns, /*sleep=*/false);
    if (wait != Wait::reached) {
      if (wait == Wait::timed_out) atomicAdd(gave_up, 1ull);
      return;
    }
    // release (system scope): pairs with the host's acquire load of echo.
    SystemWord(control->echo.value).store(2 * i + 1, ::cuda::memory_order_release);
    wait = wait_for(go, 2 * i + 2, go, kGoStop, timeout_ns, /*sleep=*/false);
    if (wait != Wait::reached) {
      if (wait == Wait::timed_out) atomicAdd(gave_up, 1ull);
      return;
    }
    if (!device_push(ring, ring_bench_descriptor(i), timeout_ns)) {
      atomicAdd(gave_up, 1ull);
      return;
    }
  }
}

}  // namespace

DeviceInfo query_device() {
  DeviceInfo info;
  const cudaError_t status = cudaGetDeviceCount(&info.count);
  if (status != cudaSuccess) {
    info.count = 0;
    info.status = std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
    return info;
  }
  info.status = "cudaSuccess";
  cudaDeviceProp properties{};
  if (info.count > 0 && cudaGetDeviceProperties(&properties, 0) == cudaSuccess) {
    info.name = properties.name;
    info.multiprocessors = properties.multiProcessorCount;
  }
  return info;
}

// Device counters live in one allocation: head, cached tail, threads that gave up.
struct RingBenchKernel::State {
  DeviceRing ring{};
  RingBenchControl* control = nullptr;
  RingBenchKernelConfig config;
  uint64_t* counters = nullptr;
  cudaStream_t stream = nullptr;
  bool running = false;
};

RingBenchKernel::RingBenchKernel(void* device_ring, uint64_t capacity, void* device_control,
                                 const RingBenchKernelConfig& config)
    : state_(std::make_unique<State>()) {
  if (!is_power_of_two(capacity))
    raise_cuda_error(kPhase, "RingBenchKernel", "ring capacity is not a power of two");
  if (config.blocks == 0 || config.threads_per_block == 0)
    raise_cuda_error(kPhase, "RingBenchKernel", "blocks and threads per block must be positive");
  state_->config = config;
  state_->control = static_cast<RingBenchControl*>(device_control);
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  check(cudaMalloc(&state_->counters, 3 * sizeof(uint64_t)), "cudaMalloc(counters)");
  check(cudaMemset(state_->counters, 0, 3 * sizeof(uint64_t)), "cudaMemset(counters)");
  check(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  auto* header = static_cast<RingHeader*>(device_ring);
  state_->ring =
      DeviceRing{header, ring_slots(header), capacity, &state_->counters[0], &state_->counters[1]};
}

RingBenchKernel::~RingBenchKernel() {
  if (state_->running) (void)cudaStreamSynchronize(state_->stream);
  if (state_->stream != nullptr) (void)cudaStreamDestroy(state_->stream);
  if (state_->counters != nullptr) (void)cudaFree(state_->counters);
}

uint32_t RingBenchKernel::max_resident_blocks() const {
  int per_multiprocessor = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_multiprocessor, throughput_kernel,
            static_cast<int>(state_->config.threads_per_block), 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  int multiprocessors = 0;
  check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0),
        "cudaDeviceGetAttribute(multiprocessors)");
  return static_cast<uint32_t>(per_multiprocessor) * static_cast<uint32_t>(multiprocessors);
}

void RingBenchKernel::launch_throughput(uint64_t ops) {
  const RingBenchKernelConfig& c = state_->config;
  PROXYEP_LAUNCH(throughput_kernel, c.blocks, c.threads_per_block, 0, state_->stream)
  (state_->ring, state_->control, ops, c.timeout_ns,
   reinterpret_cast<unsigned long long*>(&state_->counters[2]));
  check(cudaGetLastError(), "throughput_kernel launch");
  state_->running = true;
}

void RingBenchKernel::launch_latency(uint64_t samples) {
  PROXYEP_LAUNCH(latency_kernel, 1, 1, 0, state_->stream)
  (state_->ring, state_->control, samples, state_->config.timeout_ns,
   reinterpret_cast<unsigned long long*>(&state_->counters[2]));
  check(cudaGetLastError(), "latency_kernel launch");
  state_->running = true;
}

bool RingBenchKernel::done() {
  if (!state_->running) return true;
  const cudaError_t status = cudaStreamQuery(state_->stream);
  if (status == cudaErrorNotReady) return false;
  check(status, "ring bench kernel");
  return true;
}

uint64_t RingBenchKernel::finish() {
  state_->running = false;
  check(cudaStreamSynchronize(state_->stream), "ring bench kernel");
  uint64_t gave_up = 0;
  check(cudaMemcpy(&gave_up, &state_->counters[2], sizeof(gave_up), cudaMemcpyDeviceToHost),
        "cudaMemcpy(gave up)");
  check(cudaMemset(&state_->counters[2], 0, sizeof(gave_up)), "cudaMemset(gave up)");
  return gave_up;
}

}  // namespace proxyep::gpu_side::cuda
