// The MPI baseline of `proxyep bench ep` and `bench ll` (the baseline's `ll` mode): starts
// proxyep-mpi-baseline (tools/mpi_baseline/, installed next to the proxyep executable) through Open
// MPI's mpirun on the same workload and returns its JSON, whose "variant" names what ran. Two
// variants for `bench ep`: "mpi", the lean program a careful user writes (rows exchanged straight
// into the receive tensor; the default comparison), and "mpi-records", one record per row with
// its metadata, unpacked after the exchange (the baseline before the lean one). `bench ll` has
// one, "mpi". Transport, like the ProxyEP side's and loopback only: ranks on one node ->
// `--mca btl vader,self` (shared memory); ranks spanning nodes -> `--mca btl tcp,self` over lo
// (every rank of this machine then talks TCP, as the target comparison with tcp;ofi_rxm wants).
// Without the testbed neither is what a cluster's MPI does across emulated nodes (shared memory
// inside a node, a link between nodes), so `bench ep` runs both as brackets: tcp between every
// pair (slower than a cluster's MPI) and, with `shared_memory_everywhere`, vader between every
// pair (faster: no link at all); a cluster's MPI lies between them.
// pml ob1 keeps Open MPI on those BTLs (no UCX/OFI MTL), and its runtime's own TCP traffic is
// pinned to lo too. On the testbed (testbed.namespaces set: docs/TESTBED.md) the baseline gets
// exactly ProxyEP's links: mpirun runs in node 0's namespace (where rank 0 runs), its daemons
// start in the other nodes' through proxyep-netns-agent, each node's ranks use shared memory
// (vader) among themselves and tcp over the shaped links (the nodes' pep0) to other nodes.
#pragma once

#include "tools/bench/ep_options.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace proxyep::tools {

// The --baseline values that run MPI.
inline constexpr const char* kMpiLean = "mpi";
inline constexpr const char* kMpiRecords = "mpi-records";

struct MpiBaselineRequest {
  EpWorkloadCli workload;
  std::string variant = kMpiLean;  // kMpiLean or (normal mode only) kMpiRecords
  int ranks = 2;
  int ranks_per_node = 2;
  std::chrono::seconds timeout{600};
  std::vector<std::string> extra_mpirun_args;
  // Off the testbed: vader between every pair, nodes or not (the upper bracket; see above).
  bool shared_memory_everywhere = false;
  // On the testbed: each node's network namespace, in node order (empty = this host's network).
  std::vector<std::string> testbed_namespaces;
};

// Where the testbed's baseline needs files: its agent and a directory for Open MPI's sessions.
struct MpiTestbedFiles {
  std::string agent;
  std::string session_dir;
};

// The mpirun command line (for the report, and run_mpi_baseline).
std::vector<std::string> mpi_baseline_command(const MpiBaselineRequest& request,
                                              const std::string& baseline_binary,
                                              const MpiTestbedFiles& testbed = {});

// How the request's ranks talk, in words for the report ("transport" in the baseline's JSON).
std::string baseline_transport(const MpiBaselineRequest& request);

// Off the testbed, ranks spanning emulated nodes: the MPI baseline then runs twice, tcp and
// shared memory between every pair, to bracket a cluster's MPI.
bool baseline_needs_brackets(const MpiBaselineRequest& request);

// Throws the errors below for a missing baseline binary or mpirun, before anything runs.
void check_mpi_baseline_available();

// Runs the baseline and returns its JSON, plus "command" and "transport". Throws proxyep::Error
// (phase "bench.ep.baseline") naming the cause: proxyep built without MPI (no baseline binary), no
// mpirun in PATH, a non-zero exit, a timeout, output that is not the expected JSON.
nlohmann::json run_mpi_baseline(const MpiBaselineRequest& request);

}  // namespace proxyep::tools
