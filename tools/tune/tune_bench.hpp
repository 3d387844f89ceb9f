// One candidate of `proxyep tune`, measured: `repeats` runs of `proxyep bench ep ... --json
// --no-floor` (this very executable, /proc/self/exe), each a child process with the candidate's
// four parameters in its environment (PROXYEP_PROXY_THREADS, ...: the environment outranks any
// config file the child reads), bounded by the per-run timeout (child_process.hpp). In stage 1
// (threads x pin), unless disabled, one `proxyep bench proxy ... --idle-seconds 0 --json` run
// follows in the same way (same environment, same deadline), on the provider bench ep's
// internode path uses; its failure is recorded with the candidate but does not fail it. Prints
// one progress line per candidate on stderr:
// "[3/12] threads=2 pin=true chunk=1M eager=128K: p50 ... GB/s; proxy p50 7.18 us, ...".
#pragma once

#include "tools/bench/ep_bench.hpp"
#include "tools/tune/child_process.hpp"
#include "tools/tune/tune_search.hpp"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools::tune {

// The proxy benchmark of stage 1's candidates: `bench proxy`'s --runs, --latency-iters and
// --stream (8-byte writes, 2 ranks, no idle CPU window).
struct ProxyBenchPlan {
  bool enabled = true;
  int runs = 3;
  int latency_iters = 500;
  int stream = 5000;
};

struct BenchPlan {
  EpBenchOptions shape;  // ranks, ranks per node, workload, provider, reorder
  int repeats = 1;
  ProxyBenchPlan proxy;
  std::chrono::milliseconds timeout{300000};  // per child run
  // Variables every run gets besides the candidate's (parameters this tune was given on its
  // command line or in --config, which a child would not see otherwise).
  std::vector<std::pair<std::string, std::string>> env;
};

// The figures of one `bench ep --json` document. Throws proxyep::Error("tune") saying why when
// it does not parse, lacks a figure or reports outputs that do not match the reference.
Measurement parse_bench_json(const std::string& stdout_text);

// The figures of one `bench proxy --json` document (proxy.latency_us_p50,
// proxy.descriptors_per_s). Throws proxyep::Error("tune") saying why when it does not parse or
// lacks a figure.
ProxyMeasurement parse_proxy_json(const std::string& stdout_text);

// The one line that says why a run failed, from its stderr: the first "error" line, else the
// last line.
std::string failure_line(const std::string& stderr_text);

class BenchRunner {
 public:
  explicit BenchRunner(BenchPlan plan);

  // Runner of tune_search.hpp. Throws proxyep::Error("tune") when SIGINT/SIGTERM stopped it.
  Outcome measure(const Candidate& candidate, int stage, int index, int total);

  // The bench ep command line every run uses (for the report).
  const std::vector<std::string>& argv() const { return argv_; }
  // The bench proxy command line of stage 1's candidates (empty when disabled).
  const std::vector<std::string>& proxy_argv() const { return proxy_argv_; }

 private:
  // Runs the proxy benchmark for `outcome` (stage 1, its EP runs succeeded) in `env`.
  void measure_proxy(Outcome& outcome, const std::vector<std::pair<std::string, std::string>>& env,
                     int index, int total);

  BenchPlan plan_;
  std::string program_;
  std::vector<std::string> argv_;
  std::vector<std::string> proxy_argv_;
  ChildRunner children_;
};

}  // namespace proxyep::tools::tune
