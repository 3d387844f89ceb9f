// The local launcher behind `proxyep launch`: runs one command as N ranks on this machine with
// torchrun's environment, the way torchrun would across nodes.
//
// What it guarantees:
// - Each rank is its own process group (posix_spawn with POSIX_SPAWN_SETPGROUP, so the group
//   exists before the launcher can signal it), with MASTER_ADDR=127.0.0.1, a MASTER_PORT that
//   was free, RANK, WORLD_SIZE, LOCAL_RANK = rank % M, LOCAL_WORLD_SIZE = M, GROUP_RANK = rank / M
//   on top of the launcher's own environment; stdin is /dev/null.
// - The ranks share a job id and a secret no other process has (tools/launch_credentials.hpp:
//   PROXYEP_BOOTSTRAP_JOB_ID, PROXYEP_BOOTSTRAP_SECRET_FILE), unless the launcher's configuration
//   names them; the secret file is removed when run() returns.
// - Every line of a rank's stdout/stderr reaches the sink as a whole line (prefixed "[rank k] " by
//   default), partial last lines included.
// - When a rank exits non-zero or by a signal, the launcher sends SIGTERM to the other ranks'
//   process groups, SIGKILL after the grace period, and reports the first failure. The same
//   happens at the timeout and when the launcher itself gets SIGINT/SIGTERM/SIGHUP.
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

struct LaunchOptions {
  int ranks = 1;
  int ranks_per_node = 0;  // 0 = all ranks on one node
  std::vector<std::string> command;
  std::chrono::milliseconds timeout{0};   // 0 = no time limit
  std::chrono::milliseconds grace{3000};  // between SIGTERM and SIGKILL
  int master_port = 0;                    // 0 = pick a free loopback port
  // More variables for every rank (e.g. PROXYEP_* from the launcher's --set), before the
  // launcher's own (RANK, ...), which always win.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // Variables set only where the launcher's environment lacks them. All ranks run on this
  // machine, so libfabric's tcp provider is pointed at the loopback interface: without it,
  // tcp;ofi_rxm prefers the first real NIC even for traffic between local processes.
  std::vector<std::pair<std::string, std::string>> default_env{{"FI_TCP_IFACE", "lo"}};
  LineSink sink;  // empty = prefixing_sink()
  // The launcher's own messages ("rank 2 exited with code 3; stopping the other ranks"); empty =
  // "proxyep launch: <message>" on stderr.
  std::function<void(std::string_view)> report;
};

struct RankExit {
  int rank = 0;
  pid_t pid = -1;
  bool signaled = false;  // killed by a signal (else: exited)
  int code = 0;           // exit code, or the signal number
  bool stopped = false;   // the launcher signalled it (after another failure, timeout, ...)

  bool failed() const { return signaled || code != 0; }
  // "rank 2 exited with code 3", "rank 1 killed by signal 9 (Killed)"
  std::string describe() const;
};

struct LaunchResult {
  int exit_code = 0;               // 0 = every rank exited 0; else see LocalLauncher::run()
  std::string summary;             // why it failed; empty on success
  std::optional<int> failed_rank;  // the first rank that failed on its own
  bool timed_out = false;
  bool interrupted = false;
  int master_port = 0;
  std::vector<RankExit> ranks;  // index = rank; ranks never started keep pid -1
};

class LocalLauncher {
 public:
  // Validates the options; throws proxyep::Error (phase "launch") on bad ones.
  explicit LocalLauncher(LaunchOptions options);

  // Starts the ranks and waits for all of them. Exit code: the first failing rank's exit code
  // (128 + N for signal N); 127 when the command cannot be executed; 124 on timeout; 128 + N
  // when the launcher was interrupted by signal N.
  LaunchResult run();

 private:
  LaunchOptions options_;
};

}  // namespace proxyep::tools
