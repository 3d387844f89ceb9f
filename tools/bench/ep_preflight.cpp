// `bench ep`'s checks before any rank starts (ep_bench.hpp: check_ep_bench). The self-launch runs
// them before it spawns the ranks; a rank started by another launcher runs them before it joins.
#include "common/error.hpp"
#include "common/params.hpp"
#include "fabric/provider.hpp"
#include "tools/bench/ep_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "MemAvailable:   22295368 kB" from /proc/meminfo, in bytes.
std::optional<double> meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  return std::nullopt;
}

// What the cgroup (v2) this process runs in still allows, when it has a limit.
std::optional<double> cgroup_available() {
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::ifstream current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  double current = 0;
  if (!(max_file >> max_text) || max_text == "max" || !(current_file >> current))
    return std::nullopt;
  try {
    return std::max(0.0, std::stod(max_text) - current);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> memory_available() {
  auto meminfo = meminfo_available();
  auto cgroup = cgroup_available();
  if (meminfo && cgroup) return std::min(*meminfo, *cgroup);
  return meminfo ? meminfo : cgroup;
}

// The provider the ranks set up (ep_bench_cli.cpp: apply_fabric_options), when they open a
// fabric or were told one by name; nullopt when it is the default and no fabric is opened.
std::optional<std::string> provider_to_check(const EpBenchOptions& options, bool spans_nodes) {
  if (!options.provider.empty()) return options.provider;
  if (spans_nodes) return std::string("tcp");
  if (params::fabric_provider.source() != config::Source::default_value)
    return params::fabric_provider.get();
  return std::nullopt;
}

// The low-latency phase of `bench ll`: every rank's inputs (the reference regenerates them), the
// Buffer's LL area by DeepEP's LowLatencyLayout (DEEPEP_CONTRACT 3.4: two halves of send + receive
// buffers), and the [E_local, R*T, H] outputs kept at once: the last iteration's dispatch and the
// current one's, and the BF16 expert output.
double ll_phase_memory_floor(const EpWorkloadCli& w, const ep::EpShape& shape) {
  const double tokens = w.tokens, hidden = w.hidden, experts = w.experts;
  const double inputs = shape.num_ranks * tokens * hidden * (w.fp8 ? 3.0 + 4.0 / 128.0 : 2.0);
  const double dispatch_msg = 16.0 + std::max(2.0 * hidden, hidden + hidden / 32.0);
  const double combine_msg = hidden / 32.0 + 2.0 * hidden;
  const double send = std::max(tokens * dispatch_msg, experts * tokens * combine_msg);
  const double recv = experts * tokens * std::max(dispatch_msg, combine_msg);
  const double slots = shape.experts_per_rank() * double(shape.num_ranks) * tokens;
  const double recv_x = slots * hidden * (w.fp8 ? 1.0 + 4.0 / 128.0 : 2.0);
  return inputs + 2.0 * (send + recv) + 2.0 * recv_x + slots * hidden * 2.0;
}

}  // namespace

double ep_rank_memory_floor(const EpBenchOptions& options, const ep::EpShape& shape) {
  // bench ll runs its phases one after the other, each with a Buffer of its own.
  if (options.workload.low_latency) {
    EpBenchOptions normal = options;
    normal.workload.low_latency = false;
    return std::max(ll_phase_memory_floor(options.workload, shape),
                    ep_rank_memory_floor(normal, shape));
  }
  // In double: huge options must give a huge figure, not a wrapped one.
  const auto& w = options.workload;
  const double tokens = w.tokens;
  const double row = 2.0 * w.hidden;  // BF16; combine moves BF16 rows whatever dispatch sent
  const double ranks = shape.num_ranks;
  double inputs = tokens * row;
  if (w.fp8) inputs += tokens * w.hidden * (1.0 + 4.0 / 128.0);  // FP8 copy and its scales
  // The Buffer's data area holds a whole call unless --nvl-bytes makes it smaller: every rank's
  // tokens, one row each (Buffer::nvl_bytes_hint, less its per-row extras).
  const double arena = options.nvl_bytes > 0 ? double(options.nvl_bytes) : ranks * tokens * row;
  const int remote = shape.num_ranks - std::min(shape.num_ranks, shape.ranks_per_node);
  const double staging =
      remote == 0 ? 0.0
                  : (options.rdma_bytes > 0 ? double(options.rdma_bytes) : remote * tokens * row);
  // Every token goes to at least one rank, so a rank receives at least `tokens` rows on
  // average; the run keeps them five times: the first dispatch's (the combine input is made from
  // it), the last fresh and cached dispatches', the expert output and the reference's.
  const double received = 5.0 * tokens * row;
  // The reference regenerates every rank's inputs to check this rank's outputs.
  const double reference = ranks * tokens * row;
  return inputs + arena + staging + received + reference;
}

void check_ep_bench(const EpBenchOptions& options, int ranks, int ranks_per_node, int ranks_here) {
  const char* phase = options.workload.low_latency ? "bench.ll" : "bench.ep";
  require(ranks >= 1 && ranks_per_node >= 1 && ranks % ranks_per_node == 0, phase,
          "--ranks {} is not a multiple of --ranks-per-node {}", ranks, ranks_per_node);
  ep::EpShape shape{ranks, ranks_per_node, options.workload.experts};
  validate(options.workload, shape);

  const double per_rank = ep_rank_memory_floor(options, shape);
  const double needed = per_rank * ranks_here;
  if (auto available = memory_available(); available && needed > *available)
    fail(phase,
         "--tokens {} --hidden {} on {} ranks needs at least {:.1f} GiB of memory on this machine "
         "({} x {:.2f} GiB: inputs, the Buffer's arena, outputs, the reference), but only "
         "{:.1f} GiB are available: lower --tokens or --hidden",
         options.workload.tokens, options.workload.hidden, ranks, needed / kGiB, ranks_here,
         per_rank / kGiB, *available / kGiB);

  if (auto provider = provider_to_check(options, ranks > ranks_per_node)) {
    try {
      fabric::select_domains(*provider, params::fabric_domain.get(),
                             static_cast<int>(params::fabric_rails.get()));
    } catch (const Error& e) {
      fail(phase, "{}", e.message());
    }
  }
}

}  // namespace proxyep::tools
