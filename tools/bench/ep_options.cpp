#include "tools/bench/ep_options.hpp"

#include "common/error.hpp"
#include "tools/cli_checks.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {

void add_ep_workload_options(CLI::App& cmd, EpWorkloadCli& cli) {
  cmd.add_option("--tokens", cli.tokens, "tokens per rank")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--hidden", cli.hidden,
                 "hidden size (BF16 elements per token; a multiple of 8, of 128 with --fp8)")
      ->check(cli_checks::at_least(8))
      ->capture_default_str();
  cmd.add_option("--topk", cli.topk, "experts per token")
      ->check(cli_checks::in_range(1, ep::kMaxTopk))
      ->capture_default_str();
  cmd.add_option("--experts", cli.experts, "experts in total (divisible by the ranks)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--routing", cli.routing, "random (uniform load) or skewed (hot experts)")
      ->check(CLI::IsMember({"random", "skewed"}))
      ->capture_default_str();
  cmd.add_flag("--fp8", cli.fp8, "dispatch FP8 (e4m3) x with per-128-channel float scales");
  cmd.add_option("--warmup", cli.warmup, "untimed iterations first")
      ->check(cli_checks::at_least(0))
      ->capture_default_str();
  cmd.add_option("--iters", cli.iters, "timed iterations")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd.add_option("--seed", cli.seed, "workload seed (inputs and routing)")->capture_default_str();
}

void validate(const EpWorkloadCli& cli, const ep::EpShape& shape) {
  require(cli.iters >= 1, "bench.ep", "--iters must be at least 1, got {}", cli.iters);
  require(cli.warmup >= 0, "bench.ep", "--warmup must be >= 0, got {}", cli.warmup);
  require(cli.tokens >= 1, "bench.ep", "--tokens must be at least 1, got {}", cli.tokens);
  // Rows travel in 16-byte units (DeepEP's int4 copies): BF16 rows need 8 elements per unit.
  require(cli.hidden >= 8 && cli.hidden % 8 == 0, "bench.ep",
          "--hidden must be a positive multiple of 8 (rows move in 16-byte units), got {}",
          cli.hidden);
  require(cli.experts % shape.num_ranks == 0, "bench.ep",
          "--experts {} must be divisible by the {} ranks (every rank holds the same number of "
          "experts)",
          cli.experts, shape.num_ranks);
  // The rest (topk against experts, experts per rank, fp8 block sizes) as the generator checks it.
  try {
    ep::check_workload(to_workload(cli, shape));
  } catch (const Error& e) {
    fail("bench.ep", "{}", e.message());
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
  std::vector<std::string> args = {"--tokens",  std::to_string(cli.tokens),
                                   "--hidden",  std::to_string(cli.hidden),
                                   "--topk",    std::to_string(cli.topk),
                                   "--experts", std::to_string(cli.experts),
                                   "--routing", cli.routing,
                                   "--warmup",  std::to_string(cli.warmup),
                                   "--iters",   std::to_string(cli.iters),
                                   "--seed",    std::to_string(cli.seed)};
  if (cli.fp8) args.emplace_back("--fp8");
  return args;
}

nlohmann::json to_json(const EpWorkloadCli& cli) {
  return {{"tokens", cli.tokens},   {"hidden", cli.hidden},   {"topk", cli.topk},
          {"experts", cli.experts}, {"routing", cli.routing}, {"fp8", cli.fp8},
          {"warmup", cli.warmup},   {"iters", cli.iters},     {"seed", cli.seed}};
}

}  // namespace proxyep::tools
