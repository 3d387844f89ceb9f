#include "tools/tune/tune_bench.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace proxyep::tools::tune {
namespace {

constexpr size_t kDetailLines = 20;  // stderr lines kept with a failed candidate

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double mean_of(const nlohmann::json& list) {
  double sum = 0;
  for (const auto& v : list)
    sum += v.get<double>();
  return list.empty() ? 0.0 : sum / static_cast<double>(list.size());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string last_lines(const std::string& text, size_t count) {
  auto lines = lines_of(text);
  size_t from = lines.size() > count ? lines.size() - count : 0;
  std::string out;
  for (size_t i = from; i < lines.size(); ++i)
    out += lines[i] + "\n";
  return out;
}

std::string signal_name(int signal) {
  const char* name = sigabbrev_np(signal);
  return name ? fmt::format("SIG{}", name) : fmt::format("signal {}", signal);
}

// Why a finished run of `command` ("bench ep") failed ("" when it did not).
std::string run_failure(const ChildResult& run, std::chrono::milliseconds timeout,
                        const std::string& command) {
  if (run.timed_out)
    return fmt::format("timed out after {:g} s (stopped)",
                       static_cast<double>(timeout.count()) / 1000);
  if (run.exit_code == 0) return "";
  std::string why = failure_line(run.err);
  std::string how = run.exit_code > 128
                        ? fmt::format("killed by {}", signal_name(run.exit_code - 128))
                        : fmt::format("exited with code {}", run.exit_code);
  return why.empty() ? fmt::format("{} {}", command, how)
                     : fmt::format("{} {}: {}", command, how, why);
}

std::string figures(const Measurement& m) {
  return fmt::format("p50 {:.1f} us, p99 {:.1f} us, {:.2f} GB/s", m.p50_us, m.p99_us, m.gbps);
}

// Rank 0's document on `command`'s stdout. Other ranks' lines (prefixed "[rank N]") could come
// before or after it: it runs from the first line that opens an object to the first line that
// closes one without indentation (dump(2) indents every inner line).
nlohmann::json document_of(const std::string& stdout_text, const std::string& command) {
  size_t start = stdout_text.starts_with("{") ? 0 : stdout_text.find("\n{");
  require(start != std::string::npos, "tune", "{} printed no JSON document on stdout", command);
  size_t end = stdout_text.find("\n}", start);
  end = end == std::string::npos ? stdout_text.size() : end + 2;
  try {
    return nlohmann::json::parse(stdout_text.substr(start, end - start));
  } catch (const nlohmann::json::exception& e) {
    fail("tune", "{}'s --json output does not parse: {}", command, e.what());
  }
}

}  // namespace

Measurement parse_bench_json(const std::string& stdout_text) {
  nlohmann::json doc = document_of(stdout_text, "bench ep");
  try {
    if (!doc.at("verified").get<bool>()) {
      std::string first;
      const auto& mismatches = doc.at("proxyep").value("mismatches", nlohmann::json::array());
      if (!mismatches.empty()) first = ": " + mismatches.front().get<std::string>();
      fail("tune", "outputs did not match the reference{}", first);
    }
    const auto& us = doc.at("proxyep").at("total").at("us");
    Measurement m;
    m.p50_us = us.at("p50").get<double>();
    m.p99_us = us.at("p99").get<double>();
    // DeepEP's byte conventions, as bench ep's own GB/s: dispatch + combine bytes, averaged over
    // ranks, over the dispatch+combine p50.
    const auto& traffic = doc.at("traffic");
    double bytes = mean_of(traffic.at("dispatch_bytes_per_rank")) +
                   mean_of(traffic.at("combine_bytes_per_rank"));
    m.gbps = m.p50_us > 0 ? bytes / (m.p50_us * 1e-6) / 1e9 : 0.0;
    return m;
  } catch (const nlohmann::json::exception& e) {
    fail("tune", "bench ep's --json output lacks a figure: {}", e.what());
  }
}

ProxyMeasurement parse_proxy_json(const std::string& stdout_text) {
  nlohmann::json doc = document_of(stdout_text, "bench proxy");
  try {
    const auto& proxy = doc.at("proxy");
    ProxyMeasurement m;
    m.p50_us = proxy.at("latency_us_p50").get<double>();
    m.descriptors_per_s = proxy.at("descriptors_per_s").get<double>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    fail("tune", "bench proxy's --json output lacks a figure: {}", e.what());
  }
}

std::string failure_line(const std::string& stderr_text) {
  auto lines = lines_of(stderr_text);
  for (const auto& line : lines)
    if (line.find("error") != std::string::npos) return line;
  return lines.empty() ? "" : lines.back();
}

BenchRunner::BenchRunner(BenchPlan plan) : plan_(std::move(plan)) {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  require(!error, "tune", "cannot find this executable (/proc/self/exe): {}", error.message());
  program_ = self.string();
  const EpBenchOptions& shape = plan_.shape;
  argv_ = {program_,
           "bench",
           "ep",
           "--ranks",
           std::to_string(shape.ranks),
           "--ranks-per-node",
           std::to_string(shape.ranks_per_node > 0 ? shape.ranks_per_node : shape.ranks)};
  auto workload = to_args(shape.workload);
  argv_.insert(argv_.end(), workload.begin(), workload.end());
  if (!shape.provider.empty()) argv_.insert(argv_.end(), {"--provider", shape.provider});
  if (shape.reorder) argv_.emplace_back("--reorder");
  // The floor times a memcpy, the same whatever the candidate: not worth its time here.
  argv_.insert(argv_.end(), {"--json", "--no-floor"});

  if (!plan_.proxy.enabled) return;
  // The provider of bench ep's internode path: the one given, else tcp when the ranks span
  // nodes (as bench ep does), else fabric.provider as configured.
  std::string provider = shape.provider;
  if (provider.empty() && shape.ranks_per_node > 0 && shape.ranks_per_node < shape.ranks)
    provider = "tcp";
  proxy_argv_ = {program_, "bench", "proxy"};
  if (!provider.empty()) proxy_argv_.insert(proxy_argv_.end(), {"--provider", provider});
  if (shape.reorder) proxy_argv_.emplace_back("--reorder");
  proxy_argv_.insert(proxy_argv_.end(),
                     {"--runs", std::to_string(plan_.proxy.runs), "--latency-iters",
                      std::to_string(plan_.proxy.latency_iters), "--stream",
                      std::to_string(plan_.proxy.stream), "--idle-seconds", "0", "--json"});
}

void BenchRunner::measure_proxy(Outcome& outcome,
                                const std::vector<std::pair<std::string, std::string>>& env,
                                int index, int total) {
  ChildResult run = children_.run(program_, proxy_argv_, env, plan_.timeout);
  if (run.leftovers > 0)
    outcome.notes.push_back(
        fmt::format("bench proxy left {} process(es) behind; stopped", run.leftovers));
  if (int signal = ChildRunner::interrupted()) {
    fmt::print(stderr, " interrupted\n");
    fail("tune", "interrupted by {}: run {} of {} stopped", signal_name(signal), index, total);
  }
  std::string why = run_failure(run, plan_.timeout, "bench proxy");
  if (why.empty()) {
    try {
      outcome.proxy = parse_proxy_json(run.out);
    } catch (const Error& e) {
      why = e.message();
    }
  }
  if (!why.empty()) {
    outcome.proxy_error = why;
    outcome.proxy_detail = last_lines(run.err, kDetailLines);
  }
}

Outcome BenchRunner::measure(const Candidate& candidate, int stage, int index, int total) {
  fmt::print(stderr, "[{}/{}] {}:", index, total, describe(candidate));
  std::fflush(stderr);
  auto env = plan_.env;
  env.emplace_back(params::proxy_threads.env_name(), std::to_string(candidate.threads));
  env.emplace_back(params::proxy_pin.env_name(), candidate.pin ? "true" : "false");
  env.emplace_back(params::ep_chunk_bytes.env_name(), std::to_string(candidate.chunk_bytes));
  env.emplace_back(params::ep_eager_bytes.env_name(), std::to_string(candidate.eager_bytes));

  Outcome outcome;
  outcome.candidate = candidate;
  for (int repeat = 0; repeat < plan_.repeats; ++repeat) {
    ChildResult run = children_.run(program_, argv_, env, plan_.timeout);
    if (run.leftovers > 0)
      outcome.notes.push_back(
          fmt::format("run {} left {} process(es) behind; stopped", repeat + 1, run.leftovers));
    if (int signal = ChildRunner::interrupted()) {
      fmt::print(stderr, " interrupted\n");
      fail("tune", "interrupted by {}: run {} of {} stopped", signal_name(signal), index, total);
    }
    std::string why = run_failure(run, plan_.timeout, "bench ep");
    if (why.empty()) {
      try {
        outcome.runs.push_back(parse_bench_json(run.out));
      } catch (const Error& e) {
        why = e.message();
      }
    }
    if (!why.empty()) {
      outcome.ok = false;
      outcome.error = plan_.repeats > 1 ? fmt::format("run {}: {}", repeat + 1, why) : why;
      outcome.detail = last_lines(run.err, kDetailLines);
      fmt::print(stderr, " failed: {}\n", outcome.error);
      return outcome;
    }
    if (plan_.repeats > 1) fmt::print(stderr, " {:.1f}", outcome.runs.back().p50_us);
    std::fflush(stderr);
  }
  auto pick = [&](double Measurement::*field) {
    std::vector<double> values;
    for (const auto& m : outcome.runs)
      values.push_back(m.*field);
    return median(std::move(values));
  };
  outcome.ok = true;
  outcome.median = {pick(&Measurement::p50_us), pick(&Measurement::p99_us),
                    pick(&Measurement::gbps)};
  fmt::print(stderr, "{} {}{}", plan_.repeats > 1 ? " ->" : "", figures(outcome.median),
             plan_.repeats > 1 ? fmt::format(" (medians of {})", plan_.repeats) : "");
  if (stage == 1 && plan_.proxy.enabled) {
    fmt::print(stderr, ";");
    std::fflush(stderr);
    measure_proxy(outcome, env, index, total);
    if (outcome.proxy)
      fmt::print(stderr, " proxy p50 {:.2f} us, {:.0f} descriptors/s", outcome.proxy->p50_us,
                 outcome.proxy->descriptors_per_s);
    else
      fmt::print(stderr, " proxy failed: {}", outcome.proxy_error);
  }
  fmt::print(stderr, "\n");
  return outcome;
}

}  // namespace proxyep::tools::tune
