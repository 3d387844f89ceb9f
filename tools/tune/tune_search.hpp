// How `proxyep tune` walks its search space and picks the winner; the benchmark runs themselves
// are behind a Runner (tune_bench.hpp in the command, a fake in the unit test).
//
// Coordinate descent in three stages, each starting from the winner so far:
//   1. proxy.threads x proxy.pin (the whole grid), at the start's chunk and eager sizes; each
//      candidate here also runs the proxy benchmark (`bench proxy`; the sizes do not steer it);
//   2. ep.chunk_bytes, at stage 1's threads and pin;
//   3. ep.eager_bytes, at stage 2's choice.
// A stage whose list holds one value is skipped; the incumbent is measured once and takes part
// in the later stages with that measurement. Runs: |threads| x |pin| + (|chunk| - 1) +
// (|eager| - 1), not the product of all four.
//
// The choice within a stage: the lowest median dispatch+combine p50 among the candidates that
// succeeded; those within kTieFraction of it are a tie (run-to-run noise on a busy host is about
// that size), broken by fewer proxy threads (cores left to the application), then by the
// incumbent (stages 2 and 3: a changed parameter must earn its place), then by the lower proxy
// p50 latency (stage 1: a candidate without one, its proxy benchmark failed or not run, loses
// this), then by the lower p50. A failed candidate never wins; a failed proxy benchmark does
// not fail its candidate.
#pragma once

#include "tools/tune/tune_space.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::tools::tune {

constexpr double kTieFraction = 0.02;

// One benchmark run's figures: dispatch+combine (fresh dispatch, then combine) per iteration,
// slowest rank; GB/s = DeepEP's dispatch + combine bytes over the p50.
struct Measurement {
  double p50_us = 0;
  double p99_us = 0;
  double gbps = 0;
};

// One proxy benchmark run's figures (`bench proxy`, medians over its own runs): the descriptor
// to remote flag latency (half a round trip) and the descriptors streamed per second.
struct ProxyMeasurement {
  double p50_us = 0;
  double descriptors_per_s = 0;
};

struct Outcome {
  Candidate candidate;
  int stage = 0;  // 1..3 (run_search sets it)
  bool ok = false;
  std::string error;               // why it failed (when !ok)
  std::string detail;              // the failed run's last stderr lines
  Measurement median;              // medians over `runs` (when ok)
  std::vector<Measurement> runs;   // one per repeat that completed
  std::vector<std::string> notes;  // e.g. leftover processes that were stopped
  // The proxy benchmark (stage 1, when enabled and the EP runs succeeded): its figures, or why
  // it failed (`proxy_error`, the run's last stderr lines in `proxy_detail`); neither when it
  // did not run.
  std::optional<ProxyMeasurement> proxy;
  std::string proxy_error;
  std::string proxy_detail;
};

// Measures one candidate of `stage` (1..3; the proxy benchmark belongs to stage 1): `index`
// (1-based) of `total` runs of the search, for progress lines. May throw proxyep::Error to stop
// the whole search (an interrupt).
using Runner = std::function<Outcome(const Candidate& candidate, int stage, int index, int total)>;

struct SearchResult {
  std::vector<Outcome> outcomes;  // in the order they ran
  std::optional<size_t> chosen;   // index into outcomes; nullopt when every candidate failed
};

// The number of runs run_search makes over `space`.
int planned_runs(const SearchSpace& space);

// Index (into `outcomes`) of the winner among `indices` by the rule above; `incumbent` is one
// of `indices` or nullopt. nullopt when none of them succeeded.
std::optional<size_t> choose(const std::vector<Outcome>& outcomes,
                             const std::vector<size_t>& indices, std::optional<size_t> incumbent);

// Runs the three stages; `note` receives one line per stage (what it varies, and its winner).
SearchResult run_search(const SearchSpace& space, const Runner& run,
                        const std::function<void(const std::string&)>& note);

}  // namespace proxyep::tools::tune
