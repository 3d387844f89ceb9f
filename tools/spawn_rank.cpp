#include "tools/spawn_rank.hpp"

#include "tools/bench/subprocess.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace proxyep::tools {
namespace {

// Writes all of `value` (the child's errno) to `fd`, retrying on EINTR; async-signal-safe.
void report(int fd, int value) {
  const char* bytes = reinterpret_cast<const char*>(&value);
  size_t left = sizeof value;
  while (left > 0) {
    ssize_t n = ::write(fd, bytes, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

int spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               int out_fd, int err_fd, pid_t& pid) {
  if (argv.empty()) return EINVAL;
  // Found before the fork: between fork and exec the child makes only async-signal-safe calls
  // (the launcher has threads). A name with a slash is taken as it is, as execvp would.
  const std::string program =
      argv[0].find('/') != std::string::npos ? argv[0] : find_in_path(argv[0]);
  if (program.empty()) return ENOENT;
  std::vector<char*> args, envp;
  for (const auto& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  for (const auto& entry : env)
    envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  // The child reports a failure before exec here; a successful exec closes it (O_CLOEXEC), so
  // the parent reads end-of-file.
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return errno;
  const pid_t launcher = ::getpid();

  const pid_t child = ::fork();
  if (child < 0) {
    int error = errno;
    ::close(status_pipe[0]);
    ::close(status_pipe[1]);
    return error;
  }
  if (child == 0) {
    // Async-signal-safe calls only from here to exec.
    ::close(status_pipe[0]);
    const auto fail = [&](int error) {
      report(status_pipe[1], error);
      ::_exit(127);
    };
    // Own process group: stopping a rank reaches its shell and everything the shell started.
    if (::setpgid(0, 0) != 0) fail(errno);
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) fail(errno);
    if (::getppid() != launcher) fail(ESRCH);  // the launcher died before the prctl
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd < 0) fail(errno);
    if (::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 ||
        ::dup2(err_fd, STDERR_FILENO) < 0)
      fail(errno);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
    // Dispositions the launcher changed (SIGPIPE ignored, handlers) and its mask must not leak
    // into the rank.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (int signal = 1; signal < NSIG; ++signal)
      if (signal != SIGKILL && signal != SIGSTOP) ::sigaction(signal, &default_action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(program.c_str(), args.data(), envp.data());
    fail(errno);
  }

  ::close(status_pipe[1]);
  int error = 0;
  ssize_t n;
  do {
    n = ::read(status_pipe[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof error) && error != 0) {
    ::waitpid(child, nullptr, 0);  // it exited at once; reap it here, it never ran as a rank
    return error;
  }
  pid = child;
  return 0;
}

}  // namespace proxyep::tools
