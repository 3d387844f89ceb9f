// InProcessHost: the proxy host whose threads run in this process (the embedded default:
// nothing to start beside the ranks). It owns the rank's RankProxy: the fabric opens here, the
// session's arena and staging area are registered where they live, its rings go to the engine,
// and the engine's threads route immediates straight into the session's router. Waits sleep on
// the engine (ProxyEngine::wait_until). With SessionConfig::device, where the fabric registers
// device memory (FI_HMEM) and the device offers memory a NIC reads: a device staging area its
// calls' chunks leave from (GPUDirect RDMA), and its device arena registered as a write target.
#pragma once

#include "proxy/engine/rank_proxy.hpp"
#include "proxy/session/proxy_host.hpp"

#include <chrono>
#include <memory>

namespace proxyep::proxy {

class InProcessHost final : public ProxyHost {
 public:
  // `peers`: the bootstrap's liveness (null: none), which must outlive the host.
  InProcessHost(int rank, std::chrono::milliseconds timeout, const control::PeerWatch* peers)
      : rank_(rank), timeout_(timeout), peers_(peers) {}

  HostOpened open(const HostAttach& attach) override;
  void connect(const std::vector<fabric::Bytes>& addresses) override { proxy_->connect(addresses); }
  void add_regions(const std::vector<fabric::Bytes>& arenas,
                   const std::vector<fabric::Bytes>& landings,
                   const std::vector<fabric::Bytes>& device_arenas) override {
    proxy_->add_regions(arenas, landings, device_arenas);
  }
  void open_connections(const std::vector<int>& peers, const Deadline& deadline) override;
  void start() override { proxy_->start(); }
  void progress() override { proxy_->progress(); }

  void wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                  std::string_view phase, const std::function<std::string()>& describe) override;
  void quiet(const FabricPoster& poster, const DeviceRouteRing* route_ring,
             std::string_view phase) override;
  void check_health(std::string_view phase) const override;
  bool failed() const override { return proxy_ && proxy_->engine().health().failed(); }
  std::optional<std::string> peer_failure(int rank) const override;
  void stop() noexcept override {
    if (proxy_) proxy_->stop();
  }
  bool abandoned() const override { return proxy_ && proxy_->abandoned(); }
  std::vector<ThreadStats> thread_stats() const override;
  std::optional<fabric::ReorderStats> reorder_stats() const override {
    return proxy_ ? proxy_->fabric().reorder_stats() : std::nullopt;
  }
  std::string describe() const override;

  // StepProxy: registered while the threads are held out of their passes (ProxyEngine::amend:
  // the fabric is FI_THREAD_DOMAIN); the session's router counts the words.
  HostMemory host_memory(uint64_t bytes, std::string_view what) override;
  DeviceStepMemory register_device_memory(gpu_side::device::DeviceRuntime& device, uint64_t bytes,
                                          const Deadline& deadline,
                                          std::string_view phase) override;
  fabric::Bytes register_host_memory(const HostMemory& memory, const Deadline& deadline,
                                     std::string_view phase) override;
  void link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
            bool keep_polling, const Deadline& deadline, std::string_view phase) override;
  void unregister(const Deadline& deadline) override;

 private:
  // FI_HMEM: device memory of the session's device the NIC reads, registered as the device
  // staging area; null where the fabric or the device cannot.
  std::byte* open_device_staging(const HostAttach& attach);

  int rank_;
  std::chrono::milliseconds timeout_;
  const control::PeerWatch* peers_;
  std::unique_ptr<RankProxy> proxy_;
};

}  // namespace proxyep::proxy
