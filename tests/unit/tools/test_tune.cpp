// `proxyep tune`'s search logic without benchmarks: the list options, the coordinate descent
// (which candidates run, in which order, from which incumbent), the choice rule (the proxy
// benchmark's tie-break included) and how the table and JSON show a failed proxy benchmark, with
// a fake runner whose figures the test sets. The end-to-end run is check_tune.sh.
#include "common/error.hpp"
#include "tools/tune/tune_report.hpp"
#include "tools/tune/tune_search.hpp"
#include "tools/tune/tune_space.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

using namespace proxyep::tools::tune;

namespace {

Candidate at(int64_t threads, bool pin, int64_t chunk, int64_t eager) {
  return {threads, pin, chunk, eager};
}

const Candidate kCurrent = at(0, true, 1 << 20, 128 << 10);

std::string error_of(const SpaceOptions& options) {
  try {
    make_search_space(options, 4, kCurrent);
  } catch (const proxyep::Error& e) {
    return e.what();
  }
  return "";
}

// A runner that returns figures by candidate (p50 from `p50`, missing = failed; in stage 1 the
// proxy p50 from `proxy_p50`, missing = the proxy benchmark failed) and records the order of
// the runs and their stages.
struct FakeBench {
  std::map<std::string, double> p50;
  std::map<std::string, double> proxy_p50;
  bool proxy_bench = false;  // stage 1 runs the proxy benchmark
  std::vector<std::string> ran;
  std::vector<int> stages;

  Outcome operator()(const Candidate& c, int stage, int index, int total) {
    ran.push_back(describe(c));
    stages.push_back(stage);
    CHECK(index == static_cast<int>(ran.size()));
    CHECK(index <= total);
    Outcome o;
    auto it = p50.find(describe(c));
    o.ok = it != p50.end();
    if (o.ok)
      o.median.p50_us = it->second;
    else
      o.error = "fake failure";
    if (o.ok && proxy_bench && stage == 1) {
      auto proxy = proxy_p50.find(describe(c));
      if (proxy != proxy_p50.end())
        o.proxy = ProxyMeasurement{proxy->second, 1e6 / proxy->second};
      else
        o.proxy_error = "bench proxy exited with code 1: fake proxy failure";
    }
    return o;
  }
};

SearchResult search(const SearchSpace& space, FakeBench& bench) {
  return run_search(
      space, [&](const Candidate& c, int stage, int i, int n) { return bench(c, stage, i, n); },
      [](const std::string&) {});
}

}  // namespace

TEST_CASE("default lists: 1..cores-1 threads, both pins, current sizes with half and double") {
  auto space = make_search_space({}, 4, kCurrent);
  CHECK(space.threads == std::vector<int64_t>{1, 2, 3});
  CHECK(space.pin == std::vector<bool>{true, false});
  CHECK(space.chunk_bytes == std::vector<int64_t>{512 << 10, 1 << 20, 2 << 20});
  CHECK(space.eager_bytes == std::vector<int64_t>{64 << 10, 128 << 10, 256 << 10});
  // proxy.threads 0 (automatic) is not a candidate: the start takes the middle of the list.
  CHECK(space.start == at(2, true, 1 << 20, 128 << 10));
  // One core: still one thread.
  CHECK(make_search_space({}, 1, kCurrent).threads == std::vector<int64_t>{1});
  // Half of the smallest chunk is out of ep.chunk_bytes' range (4K..1G): left out.
  auto small = make_search_space({}, 2, at(1, true, 4096, 0));
  CHECK(small.chunk_bytes == std::vector<int64_t>{4096, 8192});
  CHECK(small.eager_bytes == std::vector<int64_t>{0});
}

TEST_CASE("lists: ranges, suffixes, sorting, and the errors that name the item") {
  SpaceOptions options;
  options.threads = "3, 1..2,2";
  options.pin = "off";
  options.chunk_bytes = "2M,64K";
  options.eager_bytes = "0";
  auto space = make_search_space(options, 2, kCurrent);
  CHECK(space.threads == std::vector<int64_t>{1, 2, 3});
  CHECK(space.pin == std::vector<bool>{false});
  CHECK(space.chunk_bytes == std::vector<int64_t>{64 << 10, 2 << 20});
  CHECK(space.start.chunk_bytes == 64 << 10);  // 1M not listed: the middle (lower) one

  SpaceOptions bad;
  bad.threads = "0..x";
  CHECK(error_of(bad).find("--threads '0..x': 'x' is not an integer") != std::string::npos);
  bad.threads = "0..2";
  CHECK(error_of(bad).find("0 is proxy.threads' automatic choice") != std::string::npos);
  bad.threads = "3..1";
  CHECK(error_of(bad).find("runs backwards") != std::string::npos);
  bad.threads = "1,,2";
  CHECK(error_of(bad).find("an empty item") != std::string::npos);
  bad.threads = "1..1000";
  CHECK(error_of(bad).find("refused by proxy.threads") != std::string::npos);
  bad = {};
  bad.pin = "true,maybe";
  CHECK(error_of(bad).find("--pin 'true,maybe': 'maybe' is refused by proxy.pin") !=
        std::string::npos);
  bad = {};
  bad.chunk_bytes = "1K";
  CHECK(error_of(bad).find("--chunk-bytes '1K': 1K is refused by ep.chunk_bytes: must be between "
                           "4K and 1G") != std::string::npos);
  bad.chunk_bytes = "64K..1M";
  CHECK(error_of(bad).find("ranges are for --threads only") != std::string::npos);
  bad = {};
  bad.eager_bytes = "-1";
  CHECK(error_of(bad).find("refused by ep.eager_bytes") != std::string::npos);
}

TEST_CASE("coordinate descent: the grid, then chunk, then eager, from each stage's winner") {
  SpaceOptions options;
  options.threads = "1..2";
  options.chunk_bytes = "512K,1M,2M";
  options.eager_bytes = "64K,128K";
  auto space = make_search_space(options, 4, kCurrent);
  CHECK(planned_runs(space) == 2 * 2 + 2 + 1);
  FakeBench bench;
  // Stage 1: threads=2 unpinned is clearly best. Stage 2: 2M best. Stage 3: 64K within the tie
  // margin of the incumbent (128K): the incumbent stays.
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=1M eager=128K", 100},
               {"threads=2 pin=true chunk=1M eager=128K", 95},
               {"threads=2 pin=false chunk=1M eager=128K", 80},
               {"threads=2 pin=false chunk=512K eager=128K", 90},
               {"threads=2 pin=false chunk=2M eager=128K", 70},
               {"threads=2 pin=false chunk=2M eager=64K", 69.5}};
  auto result = search(space, bench);
  CHECK(bench.ran == std::vector<std::string>{
                         "threads=1 pin=true chunk=1M eager=128K",
                         "threads=1 pin=false chunk=1M eager=128K",
                         "threads=2 pin=true chunk=1M eager=128K",
                         "threads=2 pin=false chunk=1M eager=128K",
                         "threads=2 pin=false chunk=512K eager=128K",
                         "threads=2 pin=false chunk=2M eager=128K",
                         "threads=2 pin=false chunk=2M eager=64K",
                     });
  REQUIRE(result.chosen.has_value());
  CHECK(result.outcomes[*result.chosen].candidate == at(2, false, 2 << 20, 128 << 10));
  CHECK(result.outcomes[*result.chosen].stage == 2);
  CHECK(result.outcomes[6].stage == 3);
}

TEST_CASE("choice: ties within 2% go to fewer threads; a failed candidate never wins") {
  SpaceOptions options;
  options.threads = "1..3";
  options.pin = "true";
  options.chunk_bytes = "1M";
  options.eager_bytes = "128K";
  auto space = make_search_space(options, 4, kCurrent);
  FakeBench bench;
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 101.5},
               {"threads=2 pin=true chunk=1M eager=128K", 100}};
  // threads=3 fails (it would have been fastest, but failed runs have no figures to compare).
  auto result = search(space, bench);
  REQUIRE(result.chosen.has_value());
  CHECK(result.outcomes[*result.chosen].candidate.threads == 1);
  CHECK_FALSE(result.outcomes[2].ok);

  bench = {};
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 103},
               {"threads=2 pin=true chunk=1M eager=128K", 100},
               {"threads=3 pin=true chunk=1M eager=128K", 101}};
  result = search(space, bench);
  CHECK(result.outcomes[*result.chosen].candidate.threads == 2);  // 1 is 3% slower: no tie
}

TEST_CASE("every candidate of stage 1 fails: no choice, no further stages") {
  SpaceOptions options;
  options.threads = "1";
  options.chunk_bytes = "512K,1M";
  auto space = make_search_space(options, 4, kCurrent);
  FakeBench bench;  // no figures: every run fails
  auto result = search(space, bench);
  CHECK_FALSE(result.chosen.has_value());
  CHECK(bench.ran.size() == 2);  // the two pins; chunk and eager are not tried
}

TEST_CASE("choice: among ties on threads, the lower proxy p50; none measured loses") {
  SpaceOptions options;
  options.threads = "1..2";
  options.chunk_bytes = "512K,1M";
  options.eager_bytes = "128K";
  auto space = make_search_space(options, 4, kCurrent);
  FakeBench bench;
  bench.proxy_bench = true;
  // Stage 1: both threads=1 rows tie on EP (1%); pin=false has the lower proxy latency though
  // pin=true has the lower EP p50. threads=2 has the lowest proxy latency but loses on threads.
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=1M eager=128K", 101},
               {"threads=2 pin=true chunk=1M eager=128K", 100},
               {"threads=2 pin=false chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=512K eager=128K", 101.5}};
  bench.proxy_p50 = {{"threads=1 pin=true chunk=1M eager=128K", 9.0},
                     {"threads=1 pin=false chunk=1M eager=128K", 7.5},
                     {"threads=2 pin=true chunk=1M eager=128K", 5.0},
                     {"threads=2 pin=false chunk=1M eager=128K", 5.0}};
  auto result = search(space, bench);
  CHECK(bench.stages == std::vector<int>{1, 1, 1, 1, 2});
  REQUIRE(result.chosen.has_value());
  // Stage 2's 512K ties with the incumbent, which stays (it has a proxy figure, 512K has none:
  // the proxy columns belong to stage 1, the incumbent rule decides first).
  CHECK(result.outcomes[*result.chosen].candidate == at(1, false, 1 << 20, 128 << 10));
  CHECK(result.outcomes[*result.chosen].stage == 1);
  CHECK_FALSE(result.outcomes[4].proxy.has_value());
  CHECK(result.outcomes[4].proxy_error.empty());

  // Out of the tie margin, the proxy latency does not count: the EP p50 decides.
  bench = {};
  bench.proxy_bench = true;
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=1M eager=128K", 103},
               {"threads=2 pin=true chunk=1M eager=128K", 120},
               {"threads=2 pin=false chunk=1M eager=128K", 120},
               {"threads=1 pin=true chunk=512K eager=128K", 120}};
  bench.proxy_p50 = bench.p50;
  bench.proxy_p50["threads=1 pin=false chunk=1M eager=128K"] = 1;
  result = search(space, bench);
  CHECK(result.outcomes[*result.chosen].candidate == at(1, true, 1 << 20, 128 << 10));

  // Without the proxy benchmark the tie goes to the lower EP p50, as before.
  bench = {};
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 101},
               {"threads=1 pin=false chunk=1M eager=128K", 100},
               {"threads=2 pin=true chunk=1M eager=128K", 100},
               {"threads=2 pin=false chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=512K eager=128K", 120}};
  result = search(space, bench);
  CHECK(result.outcomes[*result.chosen].candidate == at(1, false, 1 << 20, 128 << 10));
}

TEST_CASE("a failed proxy benchmark: shown, its EP result stands, it loses the tie-break") {
  SpaceOptions options;
  options.threads = "1";
  options.chunk_bytes = "1M,2M";
  options.eager_bytes = "128K";
  auto space = make_search_space(options, 4, kCurrent);
  FakeBench bench;
  bench.proxy_bench = true;
  // pin=true: the fastest EP p50 but its proxy benchmark fails; pin=false ties (1.5%) and has
  // one: it wins the tie.
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=1M eager=128K", 101.5},
               {"threads=1 pin=false chunk=2M eager=128K", 150}};
  bench.proxy_p50 = {{"threads=1 pin=false chunk=1M eager=128K", 8.25}};
  auto result = search(space, bench);
  REQUIRE(result.outcomes.size() == 3);
  CHECK(result.outcomes[0].ok);  // the EP result stands
  CHECK(result.outcomes[0].proxy_error.find("fake proxy failure") != std::string::npos);
  REQUIRE(result.chosen.has_value());
  CHECK(*result.chosen == 1);

  ReportContext context;
  context.shape = "fake";
  context.proxy_bench = true;
  std::string table = format_table(result, context);
  INFO(table);
  CHECK(table.find("proxy p50 us   proxy desc/s\n") != std::string::npos);
  CHECK(table.find("  1                  1       true              1M            128K     0.00"
                   "      100.0        0.0  proxy failed: bench proxy exited with code 1: fake "
                   "proxy failure\n") != std::string::npos);
  CHECK(table.find("* 1                  1      false              1M            128K     0.00"
                   "      101.5        0.0           8.25         121212\n") != std::string::npos);
  // Stage 2's row leaves the proxy columns blank.
  CHECK(table.find("  2                  1      false              2M            128K     0.00"
                   "      150.0        0.0\n") != std::string::npos);
  CHECK(table.find("then the incumbent, then the lower proxy p50)") != std::string::npos);

  auto json = report_json(result, context, "");
  const auto& rows = json.at("candidates");
  CHECK(rows[0].at("ok") == true);
  CHECK(rows[0].at("proxy").at("error") == "bench proxy exited with code 1: fake proxy failure");
  CHECK(rows[1].at("proxy").at("p50_us") == 8.25);
  CHECK(rows[1].at("chosen") == true);
  CHECK_FALSE(rows[2].contains("proxy"));

  // Every proxy benchmark fails: the EP figures still choose.
  bench = {};
  bench.proxy_bench = true;
  bench.p50 = {{"threads=1 pin=true chunk=1M eager=128K", 101},
               {"threads=1 pin=false chunk=1M eager=128K", 100},
               {"threads=1 pin=false chunk=2M eager=128K", 150}};
  result = search(space, bench);
  REQUIRE(result.chosen.has_value());
  CHECK(result.outcomes[*result.chosen].candidate == at(1, false, 1 << 20, 128 << 10));

  // Without the proxy benchmark the columns and the rule's last step are left out.
  context.proxy_bench = false;
  table = format_table(result, context);
  INFO(table);
  CHECK(table.find("proxy p50") == std::string::npos);
  CHECK(table.find("then the incumbent)") != std::string::npos);
}
