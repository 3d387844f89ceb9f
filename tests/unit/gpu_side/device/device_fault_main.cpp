// unit.gpu_side_device_fault: host code that reads simulated device memory faults, as reading a
// GPU's memory from the host would: by the CPU's memory protection keys where it has them
// (gpu_side/device/thread_access_key.hpp), else by the gate that keeps device memory PROT_NONE
// while the device runs nothing (simulated_device_core.hpp), which is what runs on this
// project's CI. Where neither holds the test exits 77, which ctest reports as skipped, so a run
// without the check says so instead of counting it as passed.
// Its own program, not a doctest case: a doctest case cannot end as "skipped" for ctest.
#include "gpu_side/device/simulated_device.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>

using proxyep::gpu_side::device::SimulatedDevice;

int main() {
  constexpr int kSkipped = 77;
  SimulatedDevice dev;
  if (!dev.device_memory_protected()) {
    std::printf(
        "SKIPPED: the simulated device's memory is not protected here: host reads of it are "
        "not stopped\n");
    return kSkipped;
  }
  auto memory = dev.allocate(4096);
  dev.fill(memory.get(), 1, 4096);
  dev.synchronize("test", std::chrono::seconds(10));
  // synchronize() returns once the stream's worker has closed the gate again (not merely once
  // the fill finished), so the very first read after it faults. In a child, so the fault ends the
  // child only. _exit: no destructors of the parent's state.
  const pid_t child = ::fork();
  if (child < 0) {
    std::printf("FAILED: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would report instead of dying
    volatile std::byte value = memory.get()[0];
    (void)value;
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) {
    std::printf("FAILED: waitpid: %s\n", std::strerror(errno));
    return 1;
  }
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV) {
    std::printf(
        "FAILED: a host read of device memory did not fault after synchronize() "
        "(status %d)\n",
        status);
    return 1;
  }
  std::printf("ok: a host read of device memory faulted (SIGSEGV)\n");
  return 0;
}
