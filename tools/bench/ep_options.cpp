#include "tools/bench/ep_options.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/ll_rules.hpp"
#include "tools/cli_checks.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {

EpWorkloadCli low_latency_workload_defaults() {
  EpWorkloadCli cli;
  cli.tokens = 128;
  cli.hidden = 7168;
  cli.topk = 8;
  cli.experts = 64;
  cli.fp8 = true;
  cli.low_latency = true;
  return cli;
}

void add_ep_workload_options(CLI::App& cmd, EpWorkloadCli& cli) {
  const bool ll = cli.low_latency;
  cmd.add_option("--tokens", cli.tokens,
                 ll ? "tokens per rank (num_max_dispatch_tokens_per_rank)" : "tokens per rank")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--hidden", cli.hidden,
                 ll ? "hidden size (a multiple of 128; of 512 with FP8 dispatch, as DeepEP's)"
                    : "hidden size (BF16 elements per token; a multiple of 8, of 128 with --fp8)")
      ->check(cli_checks::at_least(8))
      ->capture_default_str();
  cmd.add_option("--topk", cli.topk, "experts per token")
      ->check(cli_checks::in_range(1, ll ? ep::kLlMaxTopk : ep::kMaxTopk))
      ->capture_default_str();
  cmd.add_option("--experts", cli.experts, "experts in total (divisible by the ranks)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  if (ll) {
    cmd.add_flag_callback(
        "--bf16", [&cli] { cli.fp8 = false; },
        "dispatch BF16 (default: FP8, cast inside dispatch per 128 channels, as DeepEP's LL)");
  } else {
    cmd.add_option("--routing", cli.routing, "random (uniform load) or skewed (hot experts)")
        ->check(CLI::IsMember({"random", "skewed"}))
        ->capture_default_str();
    cmd.add_flag("--fp8", cli.fp8, "dispatch FP8 (e4m3) x with per-128-channel float scales");
  }
  cmd.add_option("--warmup", cli.warmup, "untimed iterations first")
      ->check(cli_checks::at_least(0))
      ->capture_default_str();
  cmd.add_option("--iters,--iterations", cli.iters, "timed iterations")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--seed", cli.seed, "workload seed (inputs and routing)")->capture_default_str();
}

void validate(const EpWorkloadCli& cli, const ep::EpShape& shape) {
  const char* phase = cli.low_latency ? "bench.ll" : "bench.ep";
  require(cli.iters >= 1, phase, "--iters must be at least 1, got {}", cli.iters);
  require(cli.warmup >= 0, phase, "--warmup must be >= 0, got {}", cli.warmup);
  require(cli.tokens >= 1, phase, "--tokens must be at least 1, got {}", cli.tokens);
  if (cli.low_latency) {
    // DeepEP's LL limits (DEEPEP_CONTRACT 2.7, 2.8); the test data marks the last 128 channels.
    require(cli.topk <= ep::kLlMaxTopk, phase,
            "--topk {} exceeds the low-latency limit of {} (DeepEP's num_topk <= 11)", cli.topk,
            ep::kLlMaxTopk);
    ep::LlFormat format;
    format.hidden = static_cast<uint32_t>(std::max(cli.hidden, 0));
    format.fp8 = cli.fp8;
    if (const char* why = ep::ll_hidden_error(format))
      fail(phase, "--hidden {}: {}{}", cli.hidden, why,
           cli.fp8 ? " (DeepEP's rule; with --bf16, of 128)" : "");
  }
  // Rows travel in 16-byte units (DeepEP's int4 copies): BF16 rows need 8 elements per unit.
  require(cli.hidden >= 8 && cli.hidden % 8 == 0, phase,
          "--hidden must be a positive multiple of 8 (rows move in 16-byte units), got {}",
          cli.hidden);
  require(cli.experts % shape.num_ranks == 0, phase,
          "--experts {} must be divisible by the {} ranks (every rank holds the same number of "
          "experts)",
          cli.experts, shape.num_ranks);
  // The rest (topk against experts, experts per rank, fp8 block sizes) as the generator checks it.
  try {
    ep::check_workload(to_workload(cli, shape));
  } catch (const Error& e) {
    fail(phase, "{}", e.message());
  }
}

ep::WorkloadOptions to_workload(const EpWorkloadCli& cli, const ep::EpShape& shape) {
  ep::WorkloadOptions options;
  options.shape = shape;
  options.num_tokens = cli.tokens;
  options.hidden = cli.hidden;
  options.topk = cli.topk;
  options.routing = ep::parse_routing(cli.routing);
  options.fp8 = cli.fp8;
  options.seed = cli.seed;
  return options;
}

std::vector<std::string> to_args(const EpWorkloadCli& cli) {
  std::vector<std::string> args = {
      "--tokens", std::to_string(cli.tokens), "--hidden",  std::to_string(cli.hidden),
      "--topk",   std::to_string(cli.topk),   "--experts", std::to_string(cli.experts),
      "--warmup", std::to_string(cli.warmup), "--iters",   std::to_string(cli.iters),
      "--seed",   std::to_string(cli.seed)};
  if (cli.low_latency) {
    if (!cli.fp8) args.emplace_back("--bf16");
    return args;
  }
  args.insert(args.end(), {"--routing", cli.routing});
  if (cli.fp8) args.emplace_back("--fp8");
  return args;
}

nlohmann::json to_json(const EpWorkloadCli& cli) {
  return {{"tokens", cli.tokens},
          {"hidden", cli.hidden},
          {"topk", cli.topk},
          {"experts", cli.experts},
          {"routing", cli.low_latency ? "deepep-low-latency" : cli.routing},
          {"fp8", cli.fp8},
          {"warmup", cli.warmup},
          {"iters", cli.iters},
          {"seed", cli.seed}};
}

}  // namespace proxyep::tools
