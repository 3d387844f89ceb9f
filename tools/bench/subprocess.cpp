#include "tools/bench/subprocess.hpp"

#include "common/error.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

extern char** environ;  // NOLINT: POSIX; the child inherits this process's environment

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollSlice{100};

// Waits for `pid` until `deadline`; true when it was reaped (status in `status`).
bool reap_until(pid_t pid, Clock::time_point deadline, int& status) {
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return true;
    if (Clock::now() >= deadline) return false;
    // Short: callers wait here once the child closed stdout, i.e. while it exits (a testbed
    // runs hundreds of quick `ip` commands in a row).
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Widens the calling thread's CPU affinity to every CPU (the kernel keeps only those this
// process may use) for its lifetime; a child spawned meanwhile inherits the wide mask.
class AllCpus {
 public:
  AllCpus() {
    saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      CPU_SET(cpu, &all);
    sched_setaffinity(0, sizeof all, &all);  // best effort: on failure the mask stays as it was
  }
  ~AllCpus() {
    if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  AllCpus(const AllCpus&) = delete;
  AllCpus& operator=(const AllCpus&) = delete;

 private:
  cpu_set_t saved_;
  bool saved_ok_ = false;
};

}  // namespace

std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& env) {
  std::set<std::string> replaced;
  for (const auto& [name, value] : env)
    replaced.insert(name);
  std::vector<std::string> out;
  for (char** entry = environ; *entry; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    std::string name =
        eq ? std::string(*entry, static_cast<size_t>(eq - *entry)) : std::string(*entry);
    if (!replaced.contains(name)) out.emplace_back(*entry);
  }
  for (const auto& [name, value] : env)
    out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings)
    out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string find_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");  // NOLINT: PATH is the OS's, not a ProxyEP parameter
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::filesystem::path candidate =
        std::filesystem::path(dirs.substr(start, end - start)) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

SubprocessResult run_capturing_stdout(const std::vector<std::string>& argv,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      std::chrono::milliseconds timeout,
                                      std::chrono::milliseconds grace, bool capture_stderr) {
  int fds[2];
  require(pipe2(fds, O_CLOEXEC) == 0, "subprocess", "pipe: {}", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (capture_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: see the header
  posix_spawnattr_setpgroup(&attr, 0);
  auto args = argv;
  auto environment = child_environment(env);
  auto c_args = c_strings(args);
  auto c_env = c_strings(environment);
  pid_t pid = -1;
  int rc = 0;
  {
    AllCpus all_cpus;
    rc = posix_spawnp(&pid, c_args[0], &actions, &attr, c_args.data(), c_env.data());
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  SubprocessResult result;
  if (rc != 0) {
    close(fds[0]);
    result.exit_code = 127;
    result.out = std::strerror(rc);
    return result;
  }

  auto deadline = Clock::now() + timeout;
  bool open = true;
  char chunk[65536];
  while (open && Clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(kPollSlice.count()));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    ssize_t n = read(fds[0], chunk, sizeof chunk);
    if (n > 0)
      result.out.append(chunk, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR)
      open = false;
  }
  close(fds[0]);
  int status = 0;
  // stdout closed: the child is exiting; give it until the deadline to do so.
  if (reap_until(pid, deadline, status)) {
    result.exit_code = exit_code_of(status);
    return result;
  }
  result.timed_out = true;
  kill(-pid, SIGTERM);
  if (!reap_until(pid, Clock::now() + grace, status)) {
    kill(-pid, SIGKILL);
    reap_until(pid, Clock::now() + grace, status);
  }
  result.exit_code = exit_code_of(status);
  return result;
}

}  // namespace proxyep::tools
