// Placement: how many proxy threads a rank runs, which rails each drives and where it runs.
//
// - Rails that share a libfabric domain (fake rails on one NIC) share one thread: the domain is
//   opened FI_THREAD_DOMAIN, so the provider takes no locks and two threads on one domain would
//   race inside it. Rails are grouped by their domain name; a thread drives one or more groups.
// - Thread count: proxy.threads, or by default one per domain, at most cores - 1 (one core stays
//   with the application), never more than there are domains, never fewer than one.
// - CPUs: with proxy.pin, each thread is pinned to proxy.cpus when given (thread t to the t-th
//   CPU of the list, round robin), else to the cores hwloc places nearest its NIC; a NIC hwloc
//   does not know (loopback, shm) gives every core, which is as good as unpinned.
#pragma once

#include "common/topology.hpp"
#include "fabric/fabric.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

struct PlacementOptions {
  int threads = 0;  // 0 = default from the topology
  bool pin = true;
  std::string cpus;  // cpu list; empty = cores near the NIC
};

struct ThreadPlan {
  std::vector<int> rails;  // rail indices of the fabric this thread drives
  std::vector<int> pus;    // CPUs to pin to; empty = not pinned
  std::string domain;      // the first domain's name, for logs
};

// Throws proxyep::Error("proxy.placement") for a negative thread count or a bad cpu list.
// `topology` is consulted only when pinning near NICs; it may be null otherwise.
std::vector<ThreadPlan> plan_threads(fabric::Fabric& fabric, const PlacementOptions& options,
                                     const topology::Topology* topology);

}  // namespace proxyep::proxy
