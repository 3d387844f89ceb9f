// Runs one helper program (mpirun, for the EP benchmark's baseline; ip and tc, for the testbed)
// with its stdout captured and its stderr passed through (or captured with it), bounded in time.
// The child gets its own process group, so a timeout stops it and everything it started (mpirun's
// ranks) and nothing else.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools {

struct SubprocessResult {
  int exit_code = 0;  // 128 + N when killed by signal N; 127 when it could not be started
  bool timed_out = false;
  std::string out;  // everything it wrote on stdout
};

// argv[0] is searched in PATH. `env` entries replace or add to this process's environment.
// On timeout: SIGTERM to the group, SIGKILL after `grace`. The child may use every CPU of the
// machine whatever this thread is pinned to (a rank's main thread may be): a helper that starts
// its own ranks (mpirun) would otherwise squeeze them all onto this thread's cores.
SubprocessResult run_capturing_stdout(const std::vector<std::string>& argv,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      std::chrono::milliseconds timeout,
                                      std::chrono::milliseconds grace = std::chrono::seconds(5),
                                      bool capture_stderr = false);

// The full path of `program` found in PATH, or "" when it is not there.
std::string find_in_path(const std::string& program);

// This process's environment with `env` set on top (a name in `env` replaces the inherited
// entry), as "NAME=value" strings for execve; and the null-terminated pointer array of
// `strings` (which must outlive it).
std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& env);
std::vector<char*> c_strings(std::vector<std::string>& strings);

}  // namespace proxyep::tools
