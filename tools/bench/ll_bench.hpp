// `proxyep bench ll`: DeepEP's test_low_latency.py as a benchmark (DEEPEP_CONTRACT 2.8, 4.3).
// Buffer::low_latency_dispatch / low_latency_combine on DeepEP's test data (ll_check.hpp), on N
// ranks with M per node, beside normal mode (Buffer::dispatch + combine, run_normal_mode) on the
// same tokens and routing, and an MPI baseline of the same semantics
// (tools/mpi_baseline/mpi_ll.hpp) in the same run.
//
// Per rank: bootstrap; the inputs; a Buffer with low_latency_mode and DeepEP's
// get_low_latency_rdma_size_hint; then `warmup` + `iters` iterations of
//   barrier, t0, low_latency_dispatch, t1, [hook(), t2,]   -- expert output (untimed) --
//   barrier, t3, low_latency_combine, t4, [hook(), t5]
// (with --hook, return_recv_hook: the send phase is the call returning, the receive phase the
// hook; dispatch = send + receive). Combine's input is the dequantised dispatch output of the same
// iteration (ll_expert_output), its weights the inputs' top-k weights. The last iteration's
// outputs are checked (ll_check.hpp). Then the LL Buffer goes and normal mode runs on the same
// tokens in a Buffer of its own (FP8 pre-quantised as DeepEP's normal mode wants, or BF16).
//
// Figures: the slowest rank per iteration; p50/p95/p99 in us; GB/s by DeepEP's LL byte
// conventions, messages/s through the proxy (selections to ranks on other nodes per second, per
// rank) when the ranks span nodes.
#pragma once

#include "control/bootstrap.hpp"
#include "tools/bench/ep_bench.hpp"

#include <nlohmann/json.hpp>

namespace proxyep::tools {

// Whether this build has the low-latency implementation (Buffer::low_latency_*). Without it
// `bench ll` refuses to start, naming the reason (the benchmark's tests are then skipped).
bool low_latency_available();

// ProxyEP's side on one rank (collective). Returns the results on rank 0, {} elsewhere.
nlohmann::json run_ll_bench(control::Bootstrap& bootstrap, const EpBenchOptions& options);

// Rank 0's table (the --json document carries every figure).
void print_ll_report(const nlohmann::json& results);

}  // namespace proxyep::tools
