// The `--link` option of every command that starts ranks (launch, bench ep / ll / fabric): it
// sets launch.link, which the self-launch reads (testbed_launch.hpp). One text for all of them.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;  // <CLI/CLI.hpp>, included by the files that add options
}  // namespace CLI

namespace proxyep::tools::testbed {

// Adds --link to `cmd`; a given value is set on launch.link (source: command line).
void add_link_option(CLI::App& cmd);

// The provider a benchmark's ranks open between nodes: `given` (--provider) when set; on the
// testbed (launch.link before the launch, testbed.link_gbps in its ranks) tcp in place of
// fabric.provider's "auto", which may pick shm and so bypass the links; else fabric.provider.
std::string provider_between_nodes(const std::string& given);

// In a rank on the testbed: each node's network namespace, in node order (testbed.namespaces,
// set by the launcher); empty off the testbed.
std::vector<std::string> node_namespaces();

// With a link, the fabric between nodes must be one that crosses it: shm (and anything else
// that moves bytes through memory) would bypass the shaped links. Throws proxyep::Error(`phase`)
// for `provider` (the one the ranks will open between nodes) when it would.
void check_provider_crosses_links(const std::string& provider, const std::string& phase);

}  // namespace proxyep::tools::testbed
