// The benchmark runs of `proxyep tune`, one child process at a time, bounded in time and never
// left behind:
// - stdout and stderr go to files of a private temporary directory (read back after the run), so
//   the tune's own progress lines stay readable and a chatty child cannot fill a pipe;
// - the child stays in our process group, so a Ctrl-C reaches it too (`bench ep`'s launcher then
//   stops its ranks itself); it gets PR_SET_PDEATHSIG, so a tune killed outright still stops it;
// - past its deadline, or when SIGINT/SIGTERM reaches the tune, the child is sent SIGTERM by its
//   pid (its launcher stops the ranks within its 3 s grace), then SIGKILL after kStopGrace;
// - this process is a child subreaper (PR_SET_CHILD_SUBREAPER) while a ChildRunner lives: ranks
//   whose launcher died are re-parented to us, and after every run each such leftover is stopped
//   by its pid (SIGTERM, then SIGKILL) and reaped.
// Every wait has a deadline. One ChildRunner per process at a time (it owns the signal handlers).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace proxyep::tools::tune {

struct ChildResult {
  int exit_code = 0;  // 128 + N when killed by signal N; 127 when it could not be started
  bool timed_out = false;
  bool stopped = false;  // it had to be stopped (timeout or interrupt)
  std::string out;       // its stdout
  std::string err;       // its stderr
  int leftovers = 0;     // processes it left behind that were stopped after it
};

// Between SIGTERM and SIGKILL: longer than the launcher's own grace for its ranks (3 s), so a
// stopped `bench ep` gets to stop its ranks itself.
constexpr std::chrono::milliseconds kStopGrace{5000};

class ChildRunner {
 public:
  // Makes a temporary directory for the outputs, becomes a subreaper, takes SIGINT and SIGTERM.
  // Throws proxyep::Error("tune") when it cannot.
  ChildRunner();
  ~ChildRunner();  // restores the handlers and the subreaper flag, removes the directory
  ChildRunner(const ChildRunner&) = delete;
  ChildRunner& operator=(const ChildRunner&) = delete;

  // Runs `program` with `argv` (argv[0] included) and this process's environment plus `env`
  // (replacing variables of the same name), for at most `timeout`.
  ChildResult run(const std::string& program, const std::vector<std::string>& argv,
                  const std::vector<std::pair<std::string, std::string>>& env,
                  std::chrono::milliseconds timeout);

  // The signal (SIGINT, SIGTERM) that asked the tune to stop; 0 when none came.
  static int interrupted();

 private:
  std::string dir_;
  bool was_subreaper_ = false;
};

}  // namespace proxyep::tools::tune
