// Starts a job's ranks with the local launcher, on the testbed when a link is given: builds the
// emulated nodes (netns_testbed.hpp) with links of the resolved rate (link_rate.hpp), runs each
// node's ranks in its namespace, and removes the testbed when the job ends (a failed, timed-out
// or interrupted job too: the launcher returns from all of them). Every rank learns where it
// runs: MASTER_ADDR = node 0's address, FI_TCP_IFACE and GLOO_SOCKET_IFNAME = the node's interface,
// and testbed.link_gbps / testbed.namespaces (PROXYEP_TESTBED_*).
#pragma once

#include "tools/launcher.hpp"

#include <string>

namespace proxyep::tools::testbed {

// `link` is a launch.link value ("" = no testbed: the plain launcher). With a preset and no
// ranks per node given, the preset's GPUs per node are the ranks per node when they divide the
// ranks. Everything is checked before anything starts; throws proxyep::Error.
LaunchResult launch(LaunchOptions options, const std::string& link);

// The ranks per node a launch of `ranks` ranks with `ranks_per_node` (0 = not given) and `link`
// gets: what launch() uses, for callers that check a job before they launch it.
int effective_ranks_per_node(int ranks, int ranks_per_node, const std::string& link);

}  // namespace proxyep::tools::testbed
