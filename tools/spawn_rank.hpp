// Starting one rank of `proxyep launch` (and of every bench, which launches through it): fork
// and exec, so that the rank gets SIGTERM when the launcher dies, however it dies. posix_spawn
// cannot set a parent-death signal, and a SIGKILLed launcher used to leave its ranks running,
// each holding its memory, cores and /dev/shm regions.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace proxyep::tools {

// The rank's process: `argv[0]` is found in the launcher's PATH (find_in_path; a name with a
// slash is taken as it is); it runs with `env`, in a process group of its own, stdin from
// /dev/null, stdout onto `out_fd` and stderr onto `err_fd`, every signal at its default and
// none blocked, and SIGTERM as its parent-death signal (PR_SET_PDEATHSIG). A launcher that died
// between the fork and that call is caught by comparing the parent pid. Returns 0 with `pid`
// set once the rank's program is executing, or the errno of what failed (a program that is not
// found or not executable included).
int spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               int out_fd, int err_fd, pid_t& pid);

}  // namespace proxyep::tools
