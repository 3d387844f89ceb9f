// Lets a rank-based command start its own ranks when run on its own: if the process was not
// started by a launcher (no RANK in the environment), re-run this very command line as N local
// ranks under the local launcher, passing rank 0's output through unprefixed (so --json output
// stays parseable) and prefixing the other ranks' lines.
#pragma once

namespace proxyep::tools::self_launch {

// True when RANK is set (torchrun, `proxyep launch`, mpirun wrappers).
bool under_launcher();
// Re-executes argv of this process as `ranks` local ranks with `ranks_per_node` per node (on the
// testbed when launch.link is set: tools/testbed/testbed_launch.hpp); waits for them and returns
// the exit code to use (non-zero when any rank failed).
int relaunch_as_ranks(int ranks, int ranks_per_node);
// Records argv at start-up (main calls it), for relaunch_as_ranks.
void remember_argv(int argc, char** argv);

}  // namespace proxyep::tools::self_launch
