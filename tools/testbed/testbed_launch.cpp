#include "tools/testbed/testbed_launch.hpp"

#include "common/error.hpp"
#include "common/link_spec.hpp"
#include "tools/launch_output.hpp"
#include "tools/launch_signals.hpp"
#include "tools/testbed/link_rate.hpp"
#include "tools/testbed/netns_testbed.hpp"

#include <unistd.h>

#include <fmt/format.h>

namespace proxyep::tools::testbed {
namespace {

// The launcher's report channel: LaunchOptions::report, else "proxyep launch: ..." on stderr.
void say(const std::function<void(std::string_view)>& report, const std::string& message) {
  if (report)
    report(message);
  else
    write_fully(STDERR_FILENO, fmt::format("proxyep launch: {}\n", message));
}

}  // namespace

int effective_ranks_per_node(int ranks, int ranks_per_node, const std::string& link) {
  if (ranks_per_node > 0 || link.empty()) return ranks_per_node > 0 ? ranks_per_node : ranks;
  auto spec = parse_link_spec(link);
  if (spec.preset != nullptr && ranks % spec.preset->gpus_per_node == 0)
    return spec.preset->gpus_per_node;
  return ranks;
}

LaunchResult launch(LaunchOptions options, const std::string& link) {
  if (link.empty()) return LocalLauncher(std::move(options)).run();
  const auto spec = parse_link_spec(link);
  options.ranks_per_node = effective_ranks_per_node(options.ranks, options.ranks_per_node, link);
  auto report = options.report;
  LocalLauncher launcher(std::move(options));
  require(launcher.nodes() >= 2, "launch.link",
          "--link shapes the links between nodes, but {} ranks of {} per node are one node: give "
          "--ranks-per-node smaller than the ranks",
          launcher.ranks(), launcher.ranks_per_node());
  NetnsTestbed::check_available();
  const auto resolved = resolve_link(spec, launcher.ranks(), launcher.ranks_per_node());
  // SIGINT/SIGTERM/SIGHUP from here on are recorded, not fatal: one that comes while the testbed
  // is built removes it and starts no rank (the launcher's own scope nests inside this one).
  SignalScope signals;
  NetnsTestbed testbed(launcher.nodes(), resolved.gbps, resolved.latency_us);
  if (int signal = SignalScope::pending_stop_signal(); signal != 0) {
    LaunchResult result;
    result.interrupted = true;
    result.exit_code = 128 + signal;
    result.summary = fmt::format(
        "interrupted by {} (signal {}) while the testbed was built; "
        "removed it, no rank started",
        signal_name(signal), signal);
    say(report, result.summary);
    return result;
  }
  auto message = fmt::format(
      "testbed: {} nodes of {} ranks, each in its network namespace ({}-n*), links of {:.3g} "
      "Gbit/s per node each way ({}), {}; built in {} ms",
      launcher.nodes(), launcher.ranks_per_node(), testbed.run_name(), resolved.gbps, resolved.how,
      resolved.latency_us > 0 ? fmt::format("{:.3g} us one way", resolved.latency_us)
                              : std::string("no latency added"),
      testbed.setup_time().count());
  say(report, message);
  NodePlacement placement;
  for (int node = 0; node < launcher.nodes(); ++node)
    placement.enter.push_back(testbed.enter(node));
  placement.master_addr = testbed.address_of(0);
  // The node's link for every library of the rank: libfabric's tcp provider, and gloo (torch's
  // CPU collectives, which would otherwise pick the address the host name resolves to: the
  // loopback, which is the node's own in its namespace).
  placement.env = {{"FI_TCP_IFACE", kNodeInterface},
                   {"GLOO_SOCKET_IFNAME", kNodeInterface},
                   {"PROXYEP_TESTBED_LINK_GBPS", fmt::format("{}", resolved.gbps)},
                   {"PROXYEP_TESTBED_NAMESPACES", testbed.namespace_list()}};
  launcher.place(std::move(placement));
  return launcher.run();
}

}  // namespace proxyep::tools::testbed
