// The testbed: emulated nodes as Linux network namespaces joined through a bridge by links
// shaped with tc, so that everything between nodes (fabric, bootstrap, liveness) crosses a link
// of a cluster's rate while the ranks of one node keep sharing memory (/dev/shm does not belong
// to a network namespace).
//
//   node k:  namespace <run>-n<k>, interface pep0 = 10.200.<k/250>.<k%250+1>/16, lo up
//   switch:  namespace <run>-sw, bridge br0, one port n<k> per node (the other end of pep0)
//   shaping: tbf at the rate on pep0 (what node k sends) and on n<k> (what it receives), so each
//            node has a full-duplex link of the rate; netem adds the one-way latency on pep0
//            when asked for (this needs the kernel's netem; without it only a latency of 0 runs).
//
// <run> is "proxyep-<launcher pid>-<its start time>": a namespace whose launcher is gone (killed
// with SIGKILL, say) is a leftover, and sweep_stale() removes it; every testbed sweeps before it
// builds. The destructor removes everything the testbed created, also after a failed run. All
// addresses live only inside these namespaces. The namespaces and links are made with iproute2
// (`ip`, `tc`), the ranks enter theirs with util-linux's `nsenter`, which execs the rank in
// place (the pid the launcher tracks is the rank's).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace proxyep::tools::testbed {

inline constexpr const char* kNodeInterface = "pep0";

class NetnsTestbed {
 public:
  // Throws proxyep::Error("launch.link") when this process cannot build a testbed: no
  // CAP_NET_ADMIN, or ip / tc / nsenter missing. Nothing is created.
  static void check_available();
  // Removes the namespaces of testbeds whose launcher has exited; returns their names.
  static std::vector<std::string> sweep_stale();

  // Builds `nodes` nodes with links of `gbps` (per direction) and `latency_us` (one way; 0 =
  // none). On failure removes what it made and throws proxyep::Error("launch.link").
  NetnsTestbed(int nodes, double gbps, double latency_us);
  ~NetnsTestbed();
  NetnsTestbed(const NetnsTestbed&) = delete;
  NetnsTestbed& operator=(const NetnsTestbed&) = delete;

  int nodes() const { return nodes_; }
  // "proxyep-<pid>-<start time>", the prefix of every namespace of this testbed.
  const std::string& run_name() const { return run_; }
  const std::string& namespace_of(int node) const { return namespaces_.at(node); }
  // The namespaces of the nodes, in node order, comma-separated (testbed.namespaces).
  std::string namespace_list() const;
  std::string address_of(int node) const;
  // The command prefix that runs a program in node `node`'s namespace (the same process).
  std::vector<std::string> enter(int node) const;
  std::chrono::milliseconds setup_time() const { return setup_time_; }

 private:
  void build(double gbps, double latency_us);
  void remove_all() noexcept;

  int nodes_;
  std::string run_;                      // the prefix of every name
  std::string switch_;                   // the switch's namespace
  std::vector<std::string> namespaces_;  // the nodes'
  std::vector<std::string> created_;     // namespaces made so far (removed at the end)
  std::chrono::milliseconds setup_time_{0};
};

}  // namespace proxyep::tools::testbed
