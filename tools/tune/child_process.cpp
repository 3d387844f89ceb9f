#include "tools/tune/child_process.hpp"

#include "tools/bench/subprocess.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

extern char** environ;  // NOLINT: POSIX; the child inherits this process's environment

namespace proxyep::tools::tune {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollSlice{20};

volatile std::sig_atomic_t g_interrupt = 0;
struct sigaction g_saved_int;
struct sigaction g_saved_term;

void on_signal(int signal) {
  g_interrupt = signal;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Waits for `pid` until `deadline`; true when it was reaped (its status in `status`).
bool reap_until(pid_t pid, Clock::time_point deadline, int& status) {
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return true;
    if (done < 0 && errno != EINTR) return true;  // not our child (any more): nothing to wait for
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPollSlice);
  }
}

// SIGTERM, then SIGKILL after kStopGrace; true when `pid` was reaped.
bool stop(pid_t pid, int& status) {
  kill(pid, SIGTERM);
  if (reap_until(pid, Clock::now() + kStopGrace, status)) return true;
  kill(pid, SIGKILL);
  return reap_until(pid, Clock::now() + kStopGrace, status);
}

// The processes whose parent is this one (as a subreaper: orphans of a dead launcher too).
std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == self)
      out.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return out;
}

// Stops and reaps every process left with this one as its parent; returns how many there were.
int stop_leftovers() {
  auto pids = children_of_this_process();
  for (pid_t pid : pids) {
    int status = 0;
    if (!stop(pid, status))
      log::warn("tune: process {} (left by a benchmark run) survived SIGKILL for {} ms", pid,
                kStopGrace.count());
  }
  return static_cast<int>(pids.size());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int open_output(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  require(fd >= 0, "tune", "cannot create {}: {}", path, std::strerror(errno));
  return fd;
}

}  // namespace

ChildRunner::ChildRunner() {
  std::error_code error;
  auto base = std::filesystem::temp_directory_path(error);
  std::string pattern = (error ? std::filesystem::path("/tmp") : base) / "proxyep-tune-XXXXXX";
  require(mkdtemp(pattern.data()) != nullptr, "tune", "cannot make a directory like {}: {}",
          pattern, std::strerror(errno));
  dir_ = pattern;
  int flag = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, &flag) == 0) was_subreaper_ = flag != 0;
  // Best effort: without it, leftovers of a killed launcher go to init instead of being stopped.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    log::warn("tune: PR_SET_CHILD_SUBREAPER failed ({}): ranks of a killed run may outlive it",
              std::strerror(errno));
  g_interrupt = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a sleep in the wait loop ends at once
  sigaction(SIGINT, &action, &g_saved_int);
  sigaction(SIGTERM, &action, &g_saved_term);
}

ChildRunner::~ChildRunner() {
  sigaction(SIGINT, &g_saved_int, nullptr);
  sigaction(SIGTERM, &g_saved_term, nullptr);
  prctl(PR_SET_CHILD_SUBREAPER, was_subreaper_ ? 1 : 0);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

int ChildRunner::interrupted() {
  return g_interrupt;
}

ChildResult ChildRunner::run(const std::string& program, const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env,
                             std::chrono::milliseconds timeout) {
  const std::string out_path = dir_ + "/stdout";
  const std::string err_path = dir_ + "/stderr";
  int out_fd = open_output(out_path);
  int err_fd = open_output(err_path);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto args = argv;
  auto environment = child_environment(env);
  auto c_args = c_strings(args);
  auto c_env = c_strings(environment);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid == 0) {
    // The child: async-signal-safe calls only until execve.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the tune died before the flag was set
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execve(program.c_str(), c_args.data(), c_env.data());
    const char message[] = "proxyep tune: execve of the benchmark failed\n";
    [[maybe_unused]] auto n = write(STDERR_FILENO, message, sizeof message - 1);
    _exit(127);
  }
  const int fork_errno = errno;
  close(out_fd);
  close(err_fd);
  if (null_fd >= 0) close(null_fd);
  require(pid > 0, "tune", "fork: {}", std::strerror(fork_errno));

  ChildResult result;
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  bool reaped = false;
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      reaped = true;
      break;
    }
    if (g_interrupt != 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollSlice);
  }
  if (!reaped) {
    result.timed_out = g_interrupt == 0;
    result.stopped = true;
    reaped = stop(pid, status);
    if (!reaped)
      log::warn("tune: the benchmark run (pid {}) survived SIGKILL for {} ms", pid,
                kStopGrace.count());
  }
  result.exit_code = reaped ? exit_code_of(status) : 128 + SIGKILL;
  result.leftovers = stop_leftovers();
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

}  // namespace proxyep::tools::tune
