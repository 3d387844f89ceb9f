// CUDA IPC as the node daemon uses it (gpu_side/cuda/cuda_ipc.hpp, daemon/client_device_memory):
// this process shares device memory with a pattern in it, then runs itself a second time
// (`--open HANDLE`): that process opens the handle with open_for_nic, finding the device by
// the handle's PCI bus id, checks the pattern and writes another, which this process then
// reads from its own allocation. The same handle opened in this process (the live table) must
// give the owner's address. Exits 77 (skipped) without a usable CUDA device.
#include "control/daemon_frames.hpp"
#include "gpu_side/cuda/cuda_ipc.hpp"
#include "tests/gpu/device_check.hpp"

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace proxyep;

namespace {

constexpr uint64_t kBytes = 1 << 20;

std::vector<uint8_t> pattern(uint8_t seed) {
  std::vector<uint8_t> bytes(kBytes);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 + seed);
  return bytes;
}

void copy(void* to, const void* from, cudaMemcpyKind kind) {
  if (cudaMemcpy(to, from, kBytes, kind) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
    fail("gpu test", "cudaMemcpy of {} bytes failed", kBytes);
}

// The second process: opens, checks pattern 1, writes pattern 2.
int open_side(const std::string& hex) {
  const std::vector<uint8_t> handle = control::hex_decode(hex, "handle", "gpu test");
  gpu_side::device::NicMemory nic = gpu_side::cuda::open_for_nic(handle, kBytes, "gpu test");
  std::vector<uint8_t> seen(kBytes);
  copy(seen.data(), nic.memory.get(), cudaMemcpyDeviceToHost);
  if (seen != pattern(1) || nic.registers_as_host) {
    std::printf("FAIL: the opened memory does not hold the owner's bytes\n");
    return 1;
  }
  const std::vector<uint8_t> next = pattern(2);
  copy(nic.memory.get(), next.data(), cudaMemcpyHostToDevice);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!testing::cuda_device_present()) return testing::kSkipExitCode;
  try {
    if (argc == 3 && std::string(argv[1]) == "--open") return open_side(argv[2]);
    gpu_side::device::SharedMemory shared = gpu_side::cuda::allocate_shared_memory(0, kBytes);
    const std::vector<uint8_t> first = pattern(1);
    copy(shared.memory.get(), first.data(), cudaMemcpyHostToDevice);
    // In this process: the owner's own address (CUDA refuses its own handles).
    const gpu_side::device::NicMemory here =
        gpu_side::cuda::open_for_nic(shared.handle, kBytes, "gpu test");
    bool ok = here.memory.get() == shared.memory.get();
    std::printf("%s open_for_nic in the owner's process\n", ok ? "ok  " : "FAIL");
    const std::string hex = control::hex_encode(shared.handle);
    const pid_t child = ::fork();
    if (child == 0) {
      ::execl("/proc/self/exe", argv[0], "--open", hex.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    std::vector<uint8_t> seen(kBytes);
    copy(seen.data(), shared.memory.get(), cudaMemcpyDeviceToHost);
    const bool other = WIFEXITED(status) && WEXITSTATUS(status) == 0 && seen == pattern(2);
    std::printf("%s open_for_nic in another process (exit %d)\n", other ? "ok  " : "FAIL",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ok &= other;
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
