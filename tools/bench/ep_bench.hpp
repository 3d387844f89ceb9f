// `proxyep bench ep`: expert-parallel dispatch and combine through proxyep::Buffer, with DeepEP's
// test parameters (DEEPEP_CONTRACT 4.1, 4.2), on N ranks with M per node (both the intranode path
// and, when the ranks span nodes, the fabric path run), against an MPI baseline in the same run.
//
// Per rank: bootstrap; deterministic inputs (gpu_side/ep/workload.hpp); a Buffer sized by its
// hints; the layout (untimed, as in DeepEP's timed loops); one untimed dispatch whose output is
// the combine input (tools/bench/ep_check.hpp); then `warmup` + `iters` iterations of
//   barrier, t0, fresh dispatch (layout tensors + top-k), t1, combine (handle), t2,
//   barrier, t3, cached dispatch (the handle, as DeepEP's timed loop does), t4.
// Figures (tools/bench/ep_stats.hpp): the slowest rank per iteration; p50/p95/p99 in us; GB/s
// from the p50 with DeepEP's byte conventions (ep_check.hpp: EpTraffic). After the loop every
// rank checks its outputs of the last iteration against the reference; `verified` is the AND
// over ranks. Before that check, once the Buffer is gone, the ranks time the same-run memory
// floor ("memcpy floor": one copy of each rank's received rows, tools/bench/ep_floor.hpp) unless
// --no-floor.
//
// --internode both runs the normal-mode measurement twice, per_rank then hierarchical (each with
// its own Buffer, so its own session), and reports both with their fabric bytes.
//
// The baseline (--baseline mpi) runs after our ranks are done: rank 0 destroys its Buffer and
// bootstrap (the other ranks exit, so no rank of ours busy-polls meanwhile) and starts
// proxyep-mpi-baseline through mpirun on the same options (ep_baseline.hpp).
#pragma once

#include "control/bootstrap.hpp"
#include "tools/bench/ep_check.hpp"
#include "tools/bench/ep_options.hpp"
#include "tools/bench/ep_stats.hpp"
#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace proxyep::tools {

// The options of `bench ep` and `bench ll` (workload.low_latency tells them apart).
struct EpBenchOptions {
  EpWorkloadCli workload;
  bool hook = false;  // bench ll: return_recv_hook, send and receive phases timed apart
  int ranks = 2;
  int ranks_per_node = 0;  // 0 = ranks (one node)
  std::string provider;    // fabric provider of the internode path; "" = tcp across nodes
  bool reorder = false;    // internode writes through the reorder shim (EFA SRD semantics)
  int64_t nvl_bytes = 0;   // Buffer's num_nvl_bytes; 0 = room for a whole call (one chunk per pair)
  int64_t rdma_bytes = 0;  // Buffer's num_rdma_bytes; 0 = room for a whole call
  std::string baseline = "none";  // none | mpi (lean) | mpi-records (ep_baseline.hpp)
  int baseline_timeout_s = 600;
  std::vector<std::string> mpirun_args;  // extra arguments for mpirun
  bool json = false;
  bool breakdown =
      false;  // print where the calls' time went (ep_phases.hpp); the JSON has it always
  // Time the memcpy floor (ep_floor.hpp): bench ep only (--no-floor), off for bench ll.
  bool floor = true;
  // Where bench ep's tensors live (gpu_side/device/open_device.hpp): host, simulated or cuda.
  std::string device = "host";
  // bench ep across nodes: ep.internode for the run ("" = the parameter's value), or "both":
  // per_rank first, then hierarchical, on the same inputs in the same run ("per_rank" in the
  // results, and speedup_vs_per_rank).
  std::string internode;
};

// ProxyEP's side on one rank (collective). Returns the results on rank 0, {} elsewhere.
nlohmann::json run_ep_bench(control::Bootstrap& bootstrap, const EpBenchOptions& options);

// The normal-mode measurement on one rank's `inputs` (collective; the body of run_ep_bench, which
// `bench ll` also runs on its tokens): a Buffer sized by its hints, the timed loop, then the check
// against make_reference() (called once the Buffer is gone), with the memcpy floor in between
// when options.floor. Returns on rank 0 {"num_nvl_bytes", "num_rdma_bytes", "traffic", "proxyep":
// figures and verdict}, {} elsewhere.
nlohmann::json run_normal_mode(control::Bootstrap& bootstrap, const EpBenchOptions& options,
                               const gpu_side::ep::EpShape& shape,
                               const gpu_side::ep::RankInputs& inputs,
                               const std::function<EpReference()>& make_reference);

// Every rank's report on rank 0 (empty elsewhere); collective.
RankReports gather_reports(control::Bootstrap& bootstrap, const nlohmann::json& mine,
                           const std::string& label);

// Everything about a run that can be checked before any rank starts (ep_preflight.cpp), for
// `ranks` ranks with `ranks_per_node` per node of which `ranks_here` run on this machine: the
// workload (ep_options.hpp: validate), the memory the ranks here need at least (inputs, the
// Buffer's arena and staging, outputs, the reference) against what this machine has available, and
// the fabric provider of the internode path, which libfabric must know even when the ranks never
// open a fabric. Throws proxyep::Error("bench.ep", or "bench.ll" for the low-latency form, whose
// floor is the larger of its low-latency phase's and its normal-mode phase's).
void check_ep_bench(const EpBenchOptions& options, int ranks, int ranks_per_node, int ranks_here);

// The memory the run needs at least on each rank, in bytes (what check_ep_bench compares).
double ep_rank_memory_floor(const EpBenchOptions& options, const gpu_side::ep::EpShape& shape);

// Adds `proxyep bench ep` / `proxyep bench ll` under `bench` (register_bench in cmd_bench.cpp).
void register_bench_ep(CLI::App& bench, Action& action);
void register_bench_ll(CLI::App& bench, Action& action);

}  // namespace proxyep::tools
