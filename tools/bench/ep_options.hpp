// The workload and timing options `proxyep bench ep` / `bench ll` and `proxyep-mpi-baseline`
// share: DeepEP's test parameters (--tokens --hidden --topk --experts, DEEPEP_CONTRACT 4.1-4.3),
// the routing, FP8, warm-up and timed iterations and the seed. Both programs parse them with the
// same code, and the bench hands them to the baseline as the same flags (to_args), so both run on
// the same data.
//
// Two forms. Normal mode (`bench ep`): --routing, --fp8 (BF16 by default). Low-latency mode
// (`bench ll`, low_latency set before the options are added): DeepEP's test_low_latency.py data
// (fixed routing, tools/bench/ll_inputs.hpp), FP8 dispatch by default and --bf16 to turn it off,
// and DeepEP's LL limits (top-k <= 11, hidden a multiple of 128, of 512 with FP8).
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/workload.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the files that add options
}  // namespace CLI

namespace proxyep::tools {

struct EpWorkloadCli {
  int tokens = 4096;  // per rank
  int hidden = 7168;
  int topk = 8;
  int experts = 64;
  std::string routing = "random";  // random | skewed
  bool fp8 = false;                // dispatch FP8 x with per-128-channel scales
  int warmup = 3;
  int iters = 20;
  uint64_t seed = 1;
  bool low_latency = false;  // the `bench ll` form (see above)
};

// DeepEP's low-latency defaults (DEEPEP_CONTRACT 4.3; 64 experts: the two-rank target).
EpWorkloadCli low_latency_workload_defaults();

// Adds --tokens --hidden --topk --experts --warmup --iters (alias --iterations) --seed to `cmd`,
// and --routing --fp8 (normal form) or --bf16 (low-latency form).
void add_ep_workload_options(CLI::App& cmd, EpWorkloadCli& cli);

// Checks the workload for `shape` before anything runs (iterations, tokens, hidden size, experts
// against the ranks, and what the workload generator checks); throws proxyep::Error.
void validate(const EpWorkloadCli& cli, const gpu_side::ep::EpShape& shape);

gpu_side::ep::WorkloadOptions to_workload(const EpWorkloadCli& cli,
                                          const gpu_side::ep::EpShape& shape);

// The same options as command-line flags, for the baseline program.
std::vector<std::string> to_args(const EpWorkloadCli& cli);

nlohmann::json to_json(const EpWorkloadCli& cli);

}  // namespace proxyep::tools
