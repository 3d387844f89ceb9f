// `proxyep tune`: on this node, measures `bench ep` for one EP shape over proxy thread counts,
// pinning, ep.chunk_bytes and ep.eager_bytes (coordinate descent: tools/tune/tune_search.hpp),
// and `bench proxy` for each proxy threads x pinning candidate (unless --no-proxy-bench),
// prints a table with the chosen row marked and writes the chosen values as a parameter file
// that `--config FILE` and PROXYEP_CONFIG load (docs/TUNE.md). Everything that can be checked
// (the shape, the lists, the output file) is checked before the first run.
#include "common/error.hpp"
#include "common/params.hpp"
#include "common/registry.hpp"
#include "tools/bench/ep_bench.hpp"
#include "tools/cli_checks.hpp"
#include "tools/commands.hpp"
#include "tools/self_launch.hpp"
#include "tools/tune/tune_bench.hpp"
#include "tools/tune/tune_report.hpp"
#include "tools/tune/tune_search.hpp"
#include "tools/tune/tune_space.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <memory>

namespace proxyep::tools {
namespace {

struct TuneCli {
  EpBenchOptions shape;
  tune::SpaceOptions space;
  int repeats = 1;
  tune::ProxyBenchPlan proxy;
  bool no_proxy_bench = false;
  double timeout_s = 300;
  std::string output = "proxyep-tune.json";
  bool force = false;
  bool json = false;
};

bool tuned(const config::ParamBase& param) {
  return &param == &params::proxy_threads || &param == &params::proxy_pin ||
         &param == &params::ep_chunk_bytes || &param == &params::ep_eager_bytes;
}

// Parameters this tune got from --set or a config file reach its runs through their
// environment (the environment's own PROXYEP_* variables they inherit). The tuned four are set
// per candidate; secrets come from the environment only, so they are inherited already.
std::vector<std::pair<std::string, std::string>> forwarded_parameters() {
  std::vector<std::pair<std::string, std::string>> env;
  for (auto* param : config::Registry::global().all()) {
    auto source = param->source();
    if (tuned(*param) || param->secret()) continue;
    if (source == config::Source::config_file || source == config::Source::command_line)
      env.emplace_back(param->env_name(), param->value_string());
  }
  // The runs' info lines would only be read when one fails; warnings and errors stay.
  if (params::log_level.source() == config::Source::default_value)
    env.emplace_back(params::log_level.env_name(), "warn");
  return env;
}

std::string shape_line(const EpBenchOptions& s, const tune::BenchPlan& plan) {
  const auto& w = s.workload;
  return fmt::format(
      "bench ep, {} ranks, {} per node, {} tokens x {} hidden, top-{} of {} experts{}{}; {} "
      "iterations after {} warm-up, {} run{} per candidate (medians)",
      s.ranks, s.ranks_per_node, w.tokens, w.hidden, w.topk, w.experts,
      s.provider.empty() ? "" : ", provider " + s.provider, s.reorder ? ", reorder shim" : "",
      w.iters, w.warmup, plan.repeats, plan.repeats == 1 ? "" : "s");
}

std::string proxy_line(const tune::ProxyBenchPlan& proxy) {
  if (!proxy.enabled) return "";
  return fmt::format(
      "; stage 1 also bench proxy, 8-byte writes, {} run{} of {} ping-pongs and {} streamed "
      "(medians)",
      proxy.runs, proxy.runs == 1 ? "" : "s", proxy.latency_iters, proxy.stream);
}

nlohmann::json search_json(const tune::SearchSpace& space, const tune::BenchPlan& plan,
                           const tune::BenchRunner& runner) {
  nlohmann::json proxy = nullptr;  // no proxy benchmark
  if (plan.proxy.enabled)
    proxy = {{"runs", plan.proxy.runs},
             {"latency_iters", plan.proxy.latency_iters},
             {"stream", plan.proxy.stream},
             {"command", runner.proxy_argv().empty()
                             ? nlohmann::json::array()
                             : nlohmann::json(std::vector<std::string>(
                                   runner.proxy_argv().begin() + 1, runner.proxy_argv().end()))}};
  return {{params::proxy_threads.name(), space.threads},
          {params::proxy_pin.name(), space.pin},
          {params::ep_chunk_bytes.name(), space.chunk_bytes},
          {params::ep_eager_bytes.name(), space.eager_bytes},
          {"start",
           {{"threads", space.start.threads},
            {"pin", space.start.pin},
            {"chunk_bytes", space.start.chunk_bytes},
            {"eager_bytes", space.start.eager_bytes}}},
          {"runs", tune::planned_runs(space)},
          {"repeats", plan.repeats},
          {"proxy_bench", std::move(proxy)},
          {"timeout_s", static_cast<double>(plan.timeout.count()) / 1000}};
}

// Every candidate's failure, for the error when none succeeded.
std::string failures(const tune::SearchResult& result) {
  std::string out;
  for (const auto& o : result.outcomes)
    out += fmt::format("\n  {}: {}", tune::describe(o.candidate), o.error);
  return out;
}

int run_tune(const TuneCli& cli) {
  require(!self_launch::under_launcher(), "tune",
          "proxyep tune starts its own ranks (bench ep runs); run it on its own, not under "
          "proxyep launch or torchrun (RANK is set)");
  // A day: longer is a typo, and the milliseconds must fit.
  require(cli.timeout_s <= 86400, "tune", "--timeout {:g}: at most 86400 s (a day) per run",
          cli.timeout_s);
  EpBenchOptions shape = cli.shape;
  // The whole shape is checked as bench ep checks it before it starts ranks: all on this host.
  check_ep_bench(shape, shape.ranks, shape.ranks_per_node, shape.ranks);
  auto space = tune::make_search_space(cli.space, tune::usable_cores(), tune::current_values());
  tune::check_output(cli.output, cli.force);
  const std::string output = std::filesystem::absolute(cli.output).string();

  tune::BenchPlan plan;
  plan.shape = shape;
  plan.repeats = cli.repeats;
  plan.timeout = std::chrono::milliseconds(std::llround(cli.timeout_s * 1000));
  plan.env = forwarded_parameters();
  plan.proxy = cli.proxy;
  plan.proxy.enabled = !cli.no_proxy_bench;
  tune::ReportContext context;
  context.shape = shape_line(shape, plan) + proxy_line(plan.proxy);
  context.shape_json = {{"ranks", shape.ranks},
                        {"ranks_per_node", shape.ranks_per_node},
                        {"provider", shape.provider},
                        {"reorder", shape.reorder},
                        {"workload", to_json(shape.workload)}};
  context.proxy_bench = plan.proxy.enabled;

  const int candidates = tune::planned_runs(space);
  fmt::print(stderr, "proxyep tune: {}; {} candidate{}, each run at most {:g} s\n", context.shape,
             candidates, candidates == 1 ? "" : "s", cli.timeout_s);
  tune::SearchResult result;
  {
    tune::BenchRunner runner(plan);
    context.search_json = search_json(space, plan, runner);
    auto measure = [&runner](const tune::Candidate& c, int stage, int index, int total) {
      return runner.measure(c, stage, index, total);
    };
    auto note = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
    try {
      result = tune::run_search(space, measure, note);
    } catch (const Error& e) {
      if (int signal = tune::ChildRunner::interrupted()) {
        fmt::print(stderr, "proxyep: error: {}\n", e.what());
        return 128 + signal;  // as a process the signal ended: the shell's convention
      }
      throw;
    }
  }

  if (cli.json)
    fmt::print("{}\n", tune::report_json(result, context, result.chosen ? output : "").dump(2));
  else
    tune::print_table(result, context);
  require(result.chosen.has_value(), "tune", "every candidate failed; no config written:{}",
          failures(result));
  const auto& chosen = result.outcomes[*result.chosen].candidate;
  tune::write_config(cli.output, tune::config_document(chosen), cli.force);
  // stdout stays one JSON document with --json.
  fmt::print(cli.json ? stderr : stdout,
             "wrote {}: proxyep and proxyepd load it with --config {}; every process (the "
             "Buffer's ranks included) with PROXYEP_CONFIG={}\n",
             output, output, output);
  return 0;
}

}  // namespace

void register_tune(CLI::App& app, Action& action) {
  auto cli = std::make_shared<TuneCli>();
  cli->shape.ranks = 2;
  cli->shape.ranks_per_node = 1;  // two "nodes": the proxy and fabric path runs
  auto* cmd = app.add_subcommand(
      "tune",
      "measure bench ep (and bench proxy) over proxy threads, pinning, ep.chunk_bytes and "
      "ep.eager_bytes on this node and write the best as a config file (docs/TUNE.md)");
  EpBenchOptions& shape = cli->shape;
  cmd->add_option("--ranks", shape.ranks, "ranks of the EP shape (all on this machine)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--ranks-per-node", shape.ranks_per_node,
                  "ranks per emulated node (1: every pair of ranks goes through the proxies)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  add_ep_workload_options(*cmd, shape.workload);
  cmd->add_option("--provider", shape.provider,
                  "fabric provider of the internode path (default tcp when the ranks span nodes)");
  cmd->add_flag("--reorder", shape.reorder,
                "internode writes through the reorder shim (EFA SRD semantics)");
  tune::SpaceOptions& space = cli->space;
  cmd->add_option(
      "--threads", space.threads,
      "proxy.threads to try: a list and ranges, e.g. 1..3 or 1,2,4 (default 1..cores-1, "
      "at least 1)");
  cmd->add_option("--pin", space.pin, "proxy.pin values to try (default true,false)");
  cmd->add_option("--chunk-bytes", space.chunk_bytes,
                  "ep.chunk_bytes values to try, e.g. 512K,1M,2M (default: the current value, "
                  "half and double)");
  cmd->add_option("--eager-bytes", space.eager_bytes,
                  "ep.eager_bytes values to try, e.g. 0,64K,128K (default: the current value, "
                  "half and double)");
  cmd->add_option("--repeats", cli->repeats, "bench ep runs per candidate (medians over them)")
      ->check(cli_checks::in_range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--no-proxy-bench", cli->no_proxy_bench,
                "stage 1 runs bench ep only (no bench proxy per threads x pin candidate)");
  cmd->add_option("--proxy-runs", cli->proxy.runs,
                  "bench proxy --runs for each threads x pin candidate (medians over them)")
      ->check(cli_checks::in_range(1, 100))
      ->capture_default_str();
  cmd->add_option("--proxy-latency-iters", cli->proxy.latency_iters,
                  "bench proxy --latency-iters: timed ping-pongs per run")
      ->check(cli_checks::in_range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--proxy-stream", cli->proxy.stream,
                  "bench proxy --stream: descriptors streamed per run")
      ->check(cli_checks::in_range(1, 100000000))
      ->capture_default_str();
  cmd->add_option("--timeout", cli->timeout_s,
                  "seconds one bench ep or bench proxy run may take; a slower run is stopped (its "
                  "candidate fails; a bench proxy run only loses its figures)")
      ->check(cli_checks::real_at_least(0.1))
      ->capture_default_str();
  cmd->add_option("--output,-o", cli->output,
                  "the config file to write (refused when it exists, unless --force)")
      ->capture_default_str();
  cmd->add_flag("--force", cli->force, "replace an existing --output file");
  cmd->add_flag("--json", cli->json,
                "print the result as one JSON document on stdout (progress stays on stderr)");
  cmd->callback([cli, &action] { action = [cli] { return run_tune(*cli); }; });
}

}  // namespace proxyep::tools
