// DaemonSteps: the step transport's proxy (step_link.hpp) where the proxy threads are the node
// daemon's (proxyepd, proxy.mode = daemon: daemon_session.hpp). The client's step memory, words
// and ring must be reachable from the daemon's process, and the words counted there: no client
// thread relays immediates while a captured graph runs, and the graph's kernels wait on the
// words themselves. After the attach protocol's start (daemon/attached_client.hpp):
//
//   this rank                                         proxyepd (daemon/served_rank.hpp)
//   step ring: a memfd passed with the attach ------> mapped, drained beside the first ring
//   {"proxyep":"step_memory","bytes":n,               opens the device memory by its handle
//     ["device_memory":{"kind","step":{..}}]}   (FI_HMEM) or maps the memfd, registers it
//     + [memfd of host step memory, or device fd] --> {"proxyep":"step_memory_registered",
//                                                      "region":hex | "note":"why not"}
//   allgather the regions (bootstrap)
//   {"proxyep":"step_link","words":w,"descriptors":   every rank's region under the step id,
//     [hex, ...],"keep_polling":bool}                 the words' memfd mapped and counted by
//     + memfd of the signal words --------------------> its router; {"proxyep":"step_linked"}
//
// Device memory the daemon declines (no FI_HMEM, or its provider refuses it) comes back with a
// note: host memory in a memfd serves, asked for in a second step_memory. The daemon keeps the
// registration until the client detaches; a second step_memory before step_link replaces it.
#pragma once

#include "control/daemon_connection.hpp"
#include "proxy/step_link.hpp"

#include <string>
#include <string_view>

namespace proxyep::proxy {

class DaemonSteps final : public StepProxy {
 public:
  // `daemon`: the attached session's connection, idle (no request in flight); its notices
  // were read just before (DaemonSession::check_health).
  DaemonSteps(control::DaemonConnection& daemon, int rank, std::string_view phase)
      : daemon_(daemon), rank_(rank), phase_(phase) {}
  HostMemory host_memory(uint64_t bytes, std::string_view what) override;
  DeviceStepMemory register_device_memory(gpu_side::device::DeviceRuntime& device, uint64_t bytes,
                                          const Deadline& deadline) override;
  fabric::Bytes register_host_memory(const HostMemory& memory, const Deadline& deadline) override;
  void link(const std::vector<fabric::Bytes>& descriptors, control::SignalWords& words,
            bool keep_polling, const Deadline& deadline) override;
  // Nothing to ask: the daemon drops the registration when the next one replaces it or the
  // client detaches.
  void unregister(const Deadline&) override {}

 private:
  control::DaemonConnection& daemon_;
  int rank_;
  std::string phase_;
};

}  // namespace proxyep::proxy
