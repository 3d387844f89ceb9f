#include "tools/info_memory.hpp"

#include "common/error.hpp"
#include "tools/cli_checks.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>

namespace proxyep::tools {
namespace {

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace

void add_memory_options(CLI::App& info, MemoryCli& cli) {
  auto& s = cli.shape;
  info.add_flag("--memory", cli.memory,
                "one rank's host memory for a job's shape, item by item (the options below)");
  info.add_option("--ranks", s.ranks, "--memory: ranks in the job")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  info.add_option("--ranks-per-node", s.ranks_per_node, "--memory: ranks per node")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  info.add_option("--tokens", s.tokens, "--memory: tokens per rank (LL: max dispatch tokens)")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  info.add_option("--hidden", s.hidden, "--memory: hidden size (BF16 elements per token)")
      ->check(cli_checks::at_least(8))
      ->capture_default_str();
  info.add_option("--topk", s.topk, "--memory: experts per token")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  info.add_option("--experts", s.experts, "--memory: experts in all")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  info.add_flag("--low-latency", s.low_latency,
                "--memory: a low_latency_mode Buffer sized by the LL hint");
}

int print_memory(const MemoryCli& cli, bool json) {
  const auto& s = cli.shape;
  std::vector<integrations::MemoryItem> items;
  try {
    items = integrations::buffer_memory(s);
  } catch (const Error& e) {
    std::fprintf(stderr, "proxyep info --memory: %s\n", e.what());
    return 2;
  }
  uint64_t resident = 0;
  for (const auto& item : items)
    resident += item.resident ? item.bytes : 0;
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& item : items)
      list.push_back({{"name", item.name},
                      {"bytes", item.bytes},
                      {"resident", item.resident},
                      {"formula", item.formula}});
    const nlohmann::json document = {{"shape",
                                      {{"ranks", s.ranks},
                                       {"ranks_per_node", s.ranks_per_node},
                                       {"tokens", s.tokens},
                                       {"hidden", s.hidden},
                                       {"topk", s.topk},
                                       {"experts", s.experts},
                                       {"low_latency", s.low_latency}}},
                                     {"per_rank", list},
                                     {"per_rank_bytes", resident},
                                     {"job_bytes", resident * static_cast<uint64_t>(s.ranks)}};
    std::printf("%s\n", document.dump(2).c_str());
    return 0;
  }
  std::printf("one rank of %d (%d per node), %lld tokens x %lld hidden, top-%d of %d experts%s\n",
              s.ranks, s.ranks_per_node, static_cast<long long>(s.tokens),
              static_cast<long long>(s.hidden), s.topk, s.experts,
              s.low_latency ? ", low-latency" : "");
  for (const auto& item : items)
    std::printf("  %-22s %12.2f MiB%s  %s\n", item.name.c_str(), mib(item.bytes),
                item.resident ? "" : " (address space)", item.formula.c_str());
  std::printf(
      "  %-22s %12.2f MiB per rank, %.2f GiB for the job (the Buffer's own areas; the\n"
      "  %-22s fabric provider's pools come on top: ~20 MiB per tcp rank)\n",
      "total", mib(resident), mib(resident) * s.ranks / 1024, "");
  return 0;
}

}  // namespace proxyep::tools
