// The local launcher behind `proxyep launch`: runs one command as N ranks on this machine with
// torchrun's environment, the way torchrun would across nodes.
//
// What it guarantees:
// - Nothing starts unless the whole launch is possible: N >= 1, the ranks per node divide N, N
//   is within the machine's cap (`launch.max_ranks`, 256 unless raised) and the launcher has
//   file descriptors for two pipes per rank (the soft limit is raised up to the hard one when
//   needed). The constructor checks all of it.
// - Each rank is its own process group (posix_spawn with POSIX_SPAWN_SETPGROUP, so the group
//   exists before the launcher can signal it), with MASTER_ADDR=127.0.0.1, a MASTER_PORT that
//   was free, RANK, WORLD_SIZE, LOCAL_RANK = rank % M, LOCAL_WORLD_SIZE = M, GROUP_RANK = rank / M
//   on top of the launcher's own environment; stdin is /dev/null.
// - The ranks share a job id and a secret no other process has (tools/launch_credentials.hpp:
//   PROXYEP_BOOTSTRAP_JOB_ID, PROXYEP_BOOTSTRAP_SECRET_FILE), unless the launcher's configuration
//   names them; the secret file is removed when run() returns.
// - Spawning is one step of the launcher's loop, a few ranks at a time, with output, exits and
//   signals handled in between: SIGINT/SIGTERM/SIGHUP, a rank that fails or a rank that cannot
//   start stops the spawning at once (the ranks not yet started never start) and stops the
//   started ones.
// - Every line of a rank's stdout/stderr reaches the sink as a whole line (prefixed "[rank k] " by
//   default), partial last lines included.
// - When a rank exits non-zero or by a signal, the launcher sends SIGTERM to the other ranks'
//   process groups, SIGKILL after the grace period, and reports the first failure. With
//   tolerated_failures = K, the first K such failures are reported and the others run on; the
//   launch then exits 0 when every other rank did (the summary names the tolerated ones). The same
//   happens at the timeout and when the launcher itself gets SIGINT/SIGTERM/SIGHUP. A rank that
//   then dies by another signal than the launcher's ("rank 2 was killed by SIGSEGV after the stop
//   request") is reported too.
// - When a rank has exited, and before it is reaped (so its pid cannot belong to anyone else
//   yet), the shm regions named after its pid that it left in /dev/shm are removed and reported
//   (fabric/shm_stale.hpp): a rank killed with an shm endpoint open leaves 16 MiB of RAM there.
// - It signals only process groups of children it started and has not yet reaped (a reaped
//   child's pid may already belong to someone else).
// Single-threaded: run() owns the children from start to finish and returns when all are
// reaped. It installs handlers for SIGINT/SIGTERM/SIGHUP/SIGCHLD and ignores SIGPIPE while it
// runs, restoring the previous dispositions afterwards.
#pragma once

#include "tools/launch_output.hpp"

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools {

// Where each emulated node's ranks run when not all in this host's network (the testbed,
// tools/testbed/testbed_launch.hpp): per node, a command prefix that runs the rank there (it must
// exec the rank in place, keeping its pid); the address every rank reaches rank 0 at; variables
// for every rank, over the launcher's defaults and extra_env.
struct NodePlacement {
  std::vector<std::vector<std::string>> enter;  // index = node (GROUP_RANK)
  std::string master_addr;
  std::vector<std::pair<std::string, std::string>> env;
};

struct LaunchOptions {
  int ranks = 1;
  int ranks_per_node = 0;  // 0 = all ranks on one node
  int max_ranks = 0;       // the cap on ranks; 0 = the launch.max_ranks parameter
  std::vector<std::string> command;
  std::chrono::milliseconds timeout{0};   // 0 = no time limit
  std::chrono::milliseconds grace{3000};  // between SIGTERM and SIGKILL
  // Rank failures (non-zero exit, death by a signal) that do not stop the others: a job whose
  // ranks survive a peer's loss (low-latency calls with enable_shrink) runs on. Each is reported
  // as it happens; the launch exits 0 when every other rank does.
  int tolerated_failures = 0;
  int master_port = 0;  // 0 = pick a free loopback port
  // More variables for every rank (e.g. PROXYEP_* from the launcher's --set), before the
  // launcher's own (RANK, ...), which always win.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // Variables set only where the launcher's environment lacks them. All ranks run on this
  // machine, so libfabric's tcp provider is pointed at the loopback interface: without it,
  // tcp;ofi_rxm prefers the first real NIC even for traffic between local processes. The PSM
  // libraries Debian's libfabric loads are told to leave the ranks' signals alone (so SIGTERM
  // stops a rank, Ctrl-C raises KeyboardInterrupt: common/signal_hygiene.hpp).
  std::vector<std::pair<std::string, std::string>> default_env{
      {"FI_TCP_IFACE", "lo"}, {"IPATH_NO_BACKTRACE", "1"}, {"HFI_NO_BACKTRACE", "1"}};
  LineSink sink;  // empty = prefixing_sink()
  // The launcher's own messages ("rank 2 exited with code 3; stopping the other ranks"); empty =
  // "proxyep launch: <message>" on stderr.
  std::function<void(std::string_view)> report;
};

struct RankExit {
  int rank = 0;
  pid_t pid = -1;         // -1: never started
  bool signaled = false;  // killed by a signal (else: exited)
  int code = 0;           // exit code, or the signal number
  bool stopped = false;   // the launcher signalled it (after another failure, timeout, ...)
  std::vector<std::string> removed_regions;  // shm regions named after its pid, removed

  bool failed() const { return signaled || code != 0; }
  // "rank 2 exited with code 3", "rank 1 was killed by SIGKILL (signal 9)"
  std::string describe() const;
};

// "SIGSEGV" (or "signal 77" for a number without a name).
std::string signal_name(int signal);

struct LaunchResult {
  int exit_code = 0;               // 0 = every rank exited 0; else see LocalLauncher::run()
  std::string summary;             // why it failed; empty on success
  std::optional<int> failed_rank;  // the first rank that failed on its own
  bool timed_out = false;
  bool interrupted = false;
  int master_port = 0;
  std::vector<RankExit> ranks;  // index = rank; ranks never started keep pid -1
  int started = 0;              // ranks that were spawned
  std::vector<int> tolerated;   // ranks whose failure did not stop the others (tolerated_failures)
};

class LocalLauncher {
 public:
  // Validates the options and the machine's limits for them; throws proxyep::Error (phase
  // "launch") before anything starts.
  explicit LocalLauncher(LaunchOptions options);

  int ranks() const { return options_.ranks; }
  int ranks_per_node() const { return options_.ranks_per_node; }  // after defaulting
  int nodes() const { return options_.ranks / options_.ranks_per_node; }
  // Runs each node's ranks where `placement` says (one prefix per node, checked here).
  void place(NodePlacement placement);

  // Starts the ranks and waits for all of them. Exit code: the first failing rank's exit code
  // (128 + N for signal N); 127 when the command cannot be executed; 124 on timeout; 128 + N
  // when the launcher was interrupted by signal N (while spawning too).
  LaunchResult run();

 private:
  LaunchOptions options_;
  std::optional<NodePlacement> placement_;
};

}  // namespace proxyep::tools
