// The workload and timing options `proxyep bench ep` and `proxyep-mpi-baseline` share: DeepEP's
// test parameters (--tokens --hidden --topk --experts, DEEPEP_COMPAT 4.1), the routing, FP8,
// warm-up and timed iterations and the seed. Both programs parse them with the same code, and
// the bench hands them to the baseline as the same flags (to_args), so both run on the same data.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/workload.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

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
};

// Adds --tokens --hidden --topk --experts --routing --fp8 --warmup --iters --seed to `cmd`.
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
