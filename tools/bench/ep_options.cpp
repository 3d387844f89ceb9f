#include "tools/bench/ep_options.hpp"

#include "common/error.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {

void add_ep_workload_options(CLI::App& cmd, EpWorkloadCli& cli) {
  cmd.add_option("--tokens", cli.tokens, "tokens per rank")->capture_default_str();
  cmd.add_option("--hidden", cli.hidden, "hidden size (BF16 elements per token)")
      ->capture_default_str();
  cmd.add_option("--topk", cli.topk, "experts per token")->capture_default_str();
  cmd.add_option("--experts", cli.experts, "experts in total (divisible by the ranks)")
      ->capture_default_str();
  cmd.add_option("--routing", cli.routing, "random (uniform load) or skewed (hot experts)")
      ->check(CLI::IsMember({"random", "skewed"}))
      ->capture_default_str();
  cmd.add_flag("--fp8", cli.fp8, "dispatch FP8 (e4m3) x with per-128-channel float scales");
  cmd.add_option("--warmup", cli.warmup, "untimed iterations first")->capture_default_str();
  cmd.add_option("--iters", cli.iters, "timed iterations")->capture_default_str();
  cmd.add_option("--seed", cli.seed, "workload seed (inputs and routing)")->capture_default_str();
}

void validate(const EpWorkloadCli& cli) {
  require(cli.iters >= 1, "bench.ep", "--iters must be at least 1, got {}", cli.iters);
  require(cli.warmup >= 0, "bench.ep", "--warmup must be >= 0, got {}", cli.warmup);
  require(cli.tokens >= 0, "bench.ep", "--tokens must be >= 0, got {}", cli.tokens);
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
