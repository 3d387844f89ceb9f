// CudaDevice's host side under the fake driver (runtime/fake_driver.cpp), for what the GPU
// tests' own cases (emu.cuda_device_backend, emu.cuda_device_signal) do not reach: the IPC
// handle's naming (same-process table, cudaIpcOpenMemHandle, the PCI bus id of open_for_nic),
// the capture mode's rule on unsafe calls (relax_capture), events across streams, and what a
// signal word may be. Each check prints ok or FAIL; the exit code says whether all held.
#include "gpu_side/cuda/cuda_device.hpp"
#include "gpu_side/cuda/cuda_ipc.hpp"

#include "common/error.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace proxyep;
using gpu_side::cuda::CudaDevice;

namespace {

constexpr auto kWait = std::chrono::milliseconds(5000);
// The handle's fields that the checks below alter (cuda_ipc.cpp's layout).
constexpr size_t kNonceOffset = 16;
constexpr size_t kBusIdOffset = 44;

// The message of the proxyep::Error `call` throws, "" when it throws none.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool g_ok = true;
void check(bool held, const char* what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", held ? "ok  " : "FAIL", what, detail.empty() ? "" : ": ",
              detail.c_str());
  g_ok &= held;
}

void ipc_cases(CudaDevice& device) {
  auto shared = device.allocate_shared(4096);
  check(shared.memory != nullptr && shared.handle.size() <= gpu_side::device::kSharedHandleBytes,
        "allocate_shared gives memory and a handle that fits");
  // This process's handle: the live table answers, not cudaIpcOpenMemHandle.
  auto same = device.open_shared(shared.handle, 4096, "open own");
  check(same.get() == shared.memory.get(), "open_shared of this process's handle");
  // Another process's handle (another nonce) goes through cudaIpcOpenMemHandle.
  std::vector<uint8_t> other = shared.handle;
  other[kNonceOffset] ^= 0xff;
  std::shared_ptr<std::byte[]> opened;
  const std::string failed = error_of([&] { opened = device.open_shared(other, 4096, "open"); });
  check(failed.empty() && opened.get() == shared.memory.get(),
        "open_shared through cudaIpcOpenMemHandle", failed);
  opened.reset();  // cudaIpcCloseMemHandle
  // The daemon's path: the owner found by PCI bus id.
  gpu_side::device::NicMemory nic;
  const std::string by_bus =
      error_of([&] { nic = gpu_side::cuda::open_for_nic(shared.handle, 4096, "open for nic"); });
  check(by_bus.empty() && nic.memory.get() == shared.memory.get() && !nic.registers_as_host,
        "open_for_nic finds the device by its PCI bus id", by_bus);
  std::vector<uint8_t> elsewhere = shared.handle;
  std::memcpy(elsewhere.data() + kBusIdOffset, "0000:3b:00.0", 12);
  const std::string no_bus =
      error_of([&] { (void)gpu_side::cuda::open_for_nic(elsewhere, 4096, "no such bus"); });
  check(no_bus.find("no CUDA device at PCI bus id 0000:3b:00.0") != std::string::npos,
        "open_for_nic of another bus id is refused", no_bus);
  const std::string too_big =
      error_of([&] { (void)device.open_shared(shared.handle, 8192, "big"); });
  check(too_big.find("4096 bytes, 8192 are needed") != std::string::npos,
        "open_shared of more bytes than were shared is refused", too_big);
  std::vector<uint8_t> handle = shared.handle;
  shared.memory.reset();
  same.reset();
  nic.memory.reset();
  const std::string released = error_of([&] { (void)device.open_shared(handle, 4096, "gone"); });
  check(released.find("was released") != std::string::npos,
        "open_shared after the owner released it is refused", released);
}

// CUDA's thread-local capture mode: cudaMalloc from the capturing thread fails and invalidates
// the capture, unless the thread relaxed its mode first (relax_capture, as the step transport's
// setup does).
void capture_mode_cases(CudaDevice& device) {
  device.begin_capture("strict");
  const std::string strict = error_of([&] { (void)device.allocate_for_nic(64); });
  const std::string ended = error_of([&] { (void)device.end_capture("strict"); });
  check(strict.find("cudaMalloc") != std::string::npos &&
            ended.find("the capture is invalid") != std::string::npos,
        "cudaMalloc inside a thread-local capture fails it", strict + " / " + ended);

  device.begin_capture("relaxed");
  std::string relaxed;
  {
    const std::shared_ptr<void> relax = device.relax_capture();
    relaxed = error_of([&] { (void)device.allocate_for_nic(64); });
  }
  const std::string relaxed_end = error_of([&] { (void)device.end_capture("relaxed"); });
  check(relaxed.empty() && relaxed_end.empty(), "cudaMalloc with the capture relaxed",
        relaxed + relaxed_end);
  // The mode is back: a cudaMalloc now fails the next capture again.
  device.begin_capture("restored");
  const std::string restored = error_of([&] { (void)device.allocate_for_nic(64); });
  (void)error_of([&] { (void)device.end_capture("restored"); });
  check(!restored.empty(), "relax_capture's guard restores the thread's mode");

  // A stream that joined the capture and goes before it ends: the capture lost work it recorded.
  // (Opened first: its cudaHostAlloc inside the capture would fail it, as the first case's.)
  auto worker = device.open_stream();
  const auto scratch = device.allocate(64);
  device.begin_capture("losing a stream");
  worker->wait_event(device.record(), kWait);
  worker->fill(scratch.get(), 1, 64);
  worker.reset();
  const std::string lost = error_of([&] { (void)device.end_capture("losing a stream"); });
  check(lost.find("the capture is invalid") != std::string::npos,
        "a joined stream destroyed inside the capture invalidates it", lost);
}

// An event of one stream orders another (cudaStreamWaitEvent queues the wait); reached() follows
// the stream's progress.
void event_cases(CudaDevice& device) {
  const auto other = std::static_pointer_cast<CudaDevice>(device.open_stream());
  const auto words = device.allocate(64);
  auto* word = reinterpret_cast<uint64_t*>(words.get());
  uint64_t host[2] = {0, 0};
  void* mapped = device.register_host(host, sizeof host);
  device.fill(words.get(), 0, 64);
  device.synchronize("zeroed", kWait);  // the other stream's write is not ordered after the fill
  // The other stream waits for a host-written gate, then writes 9; this stream waits for the
  // other's event, then copies that word out.
  other->wait_value(static_cast<uint64_t*>(mapped), 1, kWait, "gate");
  other->write_value(word, 9, "nine");
  const auto after_nine = other->record();
  device.wait_event(after_nine, kWait);
  device.copy(static_cast<uint64_t*>(mapped) + 1, word, 8);
  const auto copied = device.record();
  check(!device.reached(*copied, "before the gate"), "reached() is false before the gate opens");
  std::atomic_ref<uint64_t>(host[0]).store(1, std::memory_order_release);
  const std::string waited = error_of([&] { device.wait_for(*copied, "copied", kWait); });
  const uint64_t seen = std::atomic_ref<uint64_t>(host[1]).load();
  const std::string other_error = error_of([&] { other->synchronize("other", kWait); });
  check(waited.empty() && other_error.empty() && seen == 9,
        "a stream waits for another stream's event",
        waited + other_error + " copied " + std::to_string(seen));
  check(device.reached(*after_nine, "after"), "reached() once the stream passed the event");
  device.unregister_host(host);

  uint64_t plain = 0;
  const std::string refused = error_of([&] { device.write_value(&plain, 1, "plain"); });
  check(refused.find("neither device memory nor registered host memory") != std::string::npos,
        "a signal word in unregistered host memory is refused", refused);
}

}  // namespace

int main() {
  try {
    CudaDevice device(0);
    ipc_cases(device);
    capture_mode_cases(device);
    event_cases(device);
    device.synchronize("end", kWait);
  } catch (const Error& e) {
    check(false, "unexpected error", e.what());
  }
  std::printf("%s\n", g_ok ? "PASS" : "FAIL");
  return g_ok ? 0 : 1;
}
