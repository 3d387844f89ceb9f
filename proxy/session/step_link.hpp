// StepLink / StepTransport: what a device's stream needs to move a step to ranks on other nodes
// with no host thread of its own, so that the step can be captured into a graph and replayed
// (a captured low-latency call between nodes: integrations/low_latency/ll_captured.hpp):
//
//   step memory   every rank's, registered with the fabric under one region id (region::kSteps),
//   the
//                 target of the peers' writes and the source of this rank's: device memory the
//                 NIC reads and writes (GPUDirect RDMA, FI_HMEM) where the fabric and the device
//                 both can, else host memory registered with the device (the bounce the device
//                 reads and writes over PCIe, also where the provider refuses to register
//                 that device memory). Chosen from the capabilities, never from names.
//   signal words  host memory the device waits on (control/signal_words.hpp): the proxy counts
//                 a word up for every write whose immediate names it (SignalWords::imm_for), so
//                 a step knows its peers' writes landed, in whatever order they did.
//   step ring     a multi-producer descriptor ring the proxies drain (made with the session,
//                 before its proxy threads start), which the stream pushes the step's writes
//                 into (DeviceRuntime::ring_push) once the kernels before them ran.
//
// The session keeps all of it for its whole life (the region table cannot drop an entry while
// the proxies run, and a graph may be launched at any time): open() is collective, once per
// session, and ends with a barrier, so no rank's step writes reach a rank that is not ready for
// them. From then on the proxy threads keep polling instead of sleeping (proxy.graph_polling):
// nothing rings their doorbells for a graph's writes and arrivals.
//
// Whose proxy threads (StepProxy, which every proxy host is: proxy_host.hpp): this process's
// (proxy_host_in_process.hpp: the fabric registration and the region table changed while the
// threads are held out of their passes, ProxyEngine::amend, the fabric being FI_THREAD_DOMAIN;
// the rank's router counts the words), or the node daemon's (proxy_host_daemon.hpp: ring, words
// and host step memory in memfds the daemon maps, device step memory offered by its handle; the
// daemon registers them and counts the words itself, into the pages this process's device
// waits on).
#pragma once

#include "common/deadline.hpp"
#include "common/host_memory.hpp"
#include "control/bootstrap.hpp"
#include "control/signal_router.hpp"
#include "control/signal_words.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/engine/region_ids.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

// The device's view of the step transport, valid while the session lives.
struct StepLink {
  std::byte* memory = nullptr;  // this rank's step memory, as the device reaches it
  uint64_t bytes = 0;
  bool device_memory = false;  // GPUDirect RDMA (else host memory registered with the device)
  uint32_t region = 0;         // the step memory's region id, on every rank
  // This rank's signal words, as the device reaches them, and how many.
  const uint64_t* words = nullptr;
  uint32_t word_count = 0;
  gpu_side::device::DeviceRingProducer* ring = nullptr;  // the device stream's producer
};

// This rank's step memory in device memory the NIC reaches, registered with the fabric (no
// memory: the fabric or the device cannot, host memory serves).
struct DeviceStepMemory {
  std::shared_ptr<std::byte[]> memory;
  fabric::Bytes descriptor;  // the registered region's, for the other ranks
};

// Who registers the step memory with the fabric and counts the signal words: the proxy threads
// the steps' writes go through. Each call throws proxyep::Error(phase) when it fails.
class StepProxy {
 public:
  virtual ~StepProxy() = default;
  // Host memory for the step memory or the words (`what`): where the proxies can reach it.
  virtual HostMemory host_memory(uint64_t bytes, std::string_view what) = 0;
  // Device memory of `device` the NIC reaches, registered, where the fabric registers device
  // memory (FI_HMEM) and the device offers such memory; else, or where the provider refuses
  // that memory (a libfabric built without CUDA), none (logged): host memory serves.
  virtual DeviceStepMemory register_device_memory(gpu_side::device::DeviceRuntime& device,
                                                  uint64_t bytes, const Deadline& deadline,
                                                  std::string_view phase) = 0;
  // host_memory()'s step memory registered: its region's descriptor.
  virtual fabric::Bytes register_host_memory(const HostMemory& memory, const Deadline& deadline,
                                             std::string_view phase) = 0;
  // Every rank's step memory (descriptors by rank) under region::kSteps, and `words`
  // counted for every control immediate from now on; `keep_polling`: the proxy threads poll
  // instead of sleeping from now on.
  virtual void link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
                    bool keep_polling, const Deadline& deadline, std::string_view phase) = 0;
  // After a rank failed to make its step memory: drops what register_*_memory() registered.
  virtual void unregister(const Deadline& deadline) = 0;
};

class StepTransport {
 public:
  static constexpr uint64_t kRingSlots = 4096;
  static uint64_t ring_bytes() { return gpu_side::Ring::bytes_for(kRingSlots); }

  // The ring, in `ring_memory` (ring_bytes()): the heap where this process's proxies drain it
  // (engine.add_ring), a memfd the node daemon maps and drains.
  explicit StepTransport(HostMemory ring_memory);
  // Waits (bounded) for the device's stream to finish the pushes it may still run, then
  // releases the producer and the device's registrations; failures are logged.
  ~StepTransport();
  StepTransport(const StepTransport&) = delete;
  StepTransport& operator=(const StepTransport&) = delete;

  const gpu_side::Ring& ring() const { return ring_; }
  const HostMemory& ring_memory() const { return ring_memory_; }
  bool opened() const { return device_ != nullptr; }

  // Collective: `bytes` of step memory and `words` signal words on every rank (every rank must
  // pass the same), registered and counted by `proxy`, the ring attached to `device`'s stream.
  // Throws proxyep::Error(phase) when a second open is asked for, when the memory or the
  // registrations fail (on any rank: every rank fails alike), or from the bootstrap.
  StepLink open(control::Bootstrap& bootstrap, StepProxy& proxy,
                const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, uint64_t bytes,
                uint32_t words, std::chrono::milliseconds timeout, std::string_view phase);

 private:
  // This rank's step memory, words and producer; the step memory's descriptor.
  fabric::Bytes make(StepProxy& proxy, uint64_t bytes, uint32_t words, const Deadline& deadline,
                     std::string_view phase);
  void release() noexcept;

  HostMemory ring_memory_;
  gpu_side::Ring ring_;
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<control::SignalWords> words_;
  // The step memory: device memory the NIC reaches, or host memory registered with the device.
  std::shared_ptr<std::byte[]> device_memory_;
  std::unique_ptr<HostMemory> host_memory_;
  std::unique_ptr<gpu_side::device::DeviceRingProducer> producer_;
  bool ring_registered_ = false, words_registered_ = false, host_registered_ = false;
  StepLink link_;
};

}  // namespace proxyep::proxy
