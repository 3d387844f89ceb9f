// StepLink / StepTransport: what a device's stream needs to move a step to ranks on other nodes
// with no host thread of its own, so that the step can be captured into a graph and replayed
// (a captured low-latency call between nodes: integrations/low_latency/ll_captured.hpp):
//
//   step memory   every rank's, registered with the fabric under one region id (kRegion), the
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
// session, and registers while the proxy threads are held out of their passes
// (ProxyEngine::amend): the fabric is FI_THREAD_DOMAIN. It ends with a barrier, so no rank's
// step writes reach a rank that is not ready for them. From then on the proxy threads keep
// polling instead of sleeping (proxy.graph_polling; ProxyEngine::keep_polling): nothing rings
// their doorbells for a graph's writes and arrivals.
#pragma once

#include "common/host_memory.hpp"
#include "control/bootstrap.hpp"
#include "control/signal_router.hpp"
#include "control/signal_words.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/proxy_engine.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

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

class StepTransport {
 public:
  static constexpr uint32_t kRegion = 6;  // beside FabricLink's ids (fabric_channel.hpp)
  static constexpr uint64_t kRingSlots = 4096;

  // The ring, in heap memory (the proxies of this process drain it: engine.add_ring).
  StepTransport();
  // Waits (bounded) for the device's stream to finish the pushes it may still run, then
  // releases the producer and the device's registrations; failures are logged.
  ~StepTransport();
  StepTransport(const StepTransport&) = delete;
  StepTransport& operator=(const StepTransport&) = delete;

  const gpu_side::Ring& ring() const { return ring_; }
  bool opened() const { return device_ != nullptr; }

  // Collective: `bytes` of step memory and `words` signal words on every rank (every rank must
  // pass the same; the words are attached to `router`), the ring attached to `device`'s
  // stream. Throws proxyep::Error(phase) when a second open is asked for, when the memory or
  // the registrations fail, or from the bootstrap.
  StepLink open(control::Bootstrap& bootstrap, fabric::Fabric& fabric, ProxyEngine& engine,
                control::SignalRouter& router,
                const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, uint64_t bytes,
                uint32_t words, std::chrono::milliseconds timeout, std::string_view phase);

 private:
  void release() noexcept;

  HostMemory ring_memory_;
  gpu_side::Ring ring_;
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<control::SignalWords> words_;
  // The step memory: device memory the NIC reaches, or host memory registered with the device.
  std::shared_ptr<std::byte[]> device_memory_;
  std::unique_ptr<HostMemory> host_memory_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::unique_ptr<gpu_side::device::DeviceRingProducer> producer_;
  bool ring_registered_ = false, words_registered_ = false, host_registered_ = false;
  StepLink link_;
};

}  // namespace proxyep::proxy
