#include "tools/launcher.hpp"

#include "common/error.hpp"
#include "control/tcp_socket.hpp"
#include "tools/launch_credentials.hpp"
#include "tools/launch_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

extern char** environ;  // NOLINT: POSIX; the ranks inherit the launcher's environment

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollSlice{50};  // SIGCHLD cuts it short
// After the last rank exits, how long to wait for its pipes to close: only a grandchild that
// kept our pipe open (a leaked background process) makes us wait this long.
constexpr std::chrono::milliseconds kDrain{500};
constexpr int kExecFailedCode = 127;  // the shell's "command not found"
constexpr int kTimeoutCode = 124;     // timeout(1)'s

// The launcher's own variables, which replace any the launcher itself inherited.
const std::vector<std::string> kLaunchVariables = {"MASTER_ADDR", "MASTER_PORT", "RANK",
                                                   "WORLD_SIZE",  "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                                   "GROUP_RANK"};

struct Child {
  explicit Child(int rank) : out_lines(rank, Stream::out), err_lines(rank, Stream::err) {
    exit.rank = rank;
  }
  RankExit exit;
  bool reaped = true;  // until spawned: nothing to wait for
  int out_fd = -1;
  int err_fd = -1;
  LineSplitter out_lines;
  LineSplitter err_lines;
};

std::string variable_name(const char* entry) {
  const char* eq = std::strchr(entry, '=');
  return eq ? std::string(entry, eq) : std::string(entry);
}

// One run of the launcher: the children, their pipes, and the stop sequence.
class Session {
 public:
  Session(const LaunchOptions& options, int port) : options_(options), port_(port) {
    for (int rank = 0; rank < options.ranks; ++rank)
      children_.emplace_back(rank);
  }
  LaunchResult run();

 private:
  std::vector<std::string> environment_for(int rank) const;
  int spawn(Child& child);  // 0 or the errno of the failed spawn
  void spawn_all();
  void pump_output(std::chrono::milliseconds wait);
  void read_pipe(int& fd, LineSplitter& lines);
  void reap();
  void begin_stop(std::string why, int exit_code);
  void signal_unreaped(int signal);
  bool all_reaped() const;
  bool pipes_open() const;
  void report(const std::string& message) const;
  LaunchResult finish();

  const LaunchOptions& options_;
  int port_;
  std::vector<Child> children_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
  std::string stop_reason_;
  int stop_code_ = 0;
  std::optional<int> failed_rank_;
  bool timed_out_ = false;
  bool interrupted_ = false;
};

std::vector<std::string> Session::environment_for(int rank) const {
  const int per_node = options_.ranks_per_node;
  std::vector<std::pair<std::string, std::string>> ours = options_.extra_env;
  ours.insert(ours.end(), {{"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", std::to_string(port_)},
                           {"RANK", std::to_string(rank)},
                           {"WORLD_SIZE", std::to_string(options_.ranks)},
                           {"LOCAL_RANK", std::to_string(rank % per_node)},
                           {"LOCAL_WORLD_SIZE", std::to_string(per_node)},
                           {"GROUP_RANK", std::to_string(rank / per_node)}});
  std::set<std::string> replaced(kLaunchVariables.begin(), kLaunchVariables.end());
  for (const auto& [name, value] : ours)
    replaced.insert(name);
  std::vector<std::string> env;
  std::set<std::string> inherited;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    inherited.insert(variable_name(*entry));
    if (!replaced.contains(variable_name(*entry))) env.emplace_back(*entry);
  }
  for (const auto& [name, value] : options_.default_env)
    if (!inherited.contains(name) && !replaced.contains(name)) env.push_back(name + "=" + value);
  // Later entries win over earlier ones of the same name (ours over extra_env).
  std::set<std::string> seen;
  for (auto it = ours.rbegin(); it != ours.rend(); ++it)
    if (seen.insert(it->first).second) env.push_back(it->first + "=" + it->second);
  return env;
}

int Session::spawn(Child& child) {
  const int rank = child.exit.rank;
  int out[2], err[2];
  // Close-on-exec everywhere: a sibling holding our pipe's write end would delay our EOF.
  if (::pipe2(out, O_CLOEXEC) != 0) return errno;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int error = errno;
    ::close(out[0]);
    ::close(out[1]);
    return error;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Own process group: stopping a rank reaches its shell and everything the shell started.
  posix_spawnattr_setpgroup(&attributes, 0);
  // Dispositions we changed (SIGPIPE ignored, handlers) must not leak into the ranks.
  sigset_t defaults, empty;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD})
    sigaddset(&defaults, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  auto env = environment_for(rank);
  std::vector<char*> envp, argv;
  for (auto& entry : env)
    envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = options_.command;
  for (auto& arg : command)
    argv.push_back(arg.data());
  argv.push_back(nullptr);

  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return rc;
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  child.exit.pid = pid;
  child.reaped = false;
  child.out_fd = out[0];
  child.err_fd = err[0];
  return 0;
}

void Session::spawn_all() {
  for (auto& child : children_) {
    int error = spawn(child);
    if (error == 0) continue;
    begin_stop(fmt::format("rank {} could not start '{}': {}", child.exit.rank, options_.command[0],
                           control::errno_text(error)),
               kExecFailedCode);
    return;
  }
}

void Session::read_pipe(int& fd, LineSplitter& lines) {
  char buffer[16384];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      lines.feed(std::string_view(buffer, static_cast<size_t>(n)), options_.sink);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // End of stream (or a broken pipe): the last partial line still counts.
    lines.finish(options_.sink);
    ::close(fd);
    fd = -1;
  }
}

void Session::pump_output(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  for (const auto& child : children_) {
    if (child.out_fd >= 0) fds.push_back({child.out_fd, POLLIN, 0});
    if (child.err_fd >= 0) fds.push_back({child.err_fd, POLLIN, 0});
  }
  // EINTR (SIGCHLD, SIGINT) just ends the wait early; the caller looks at what happened.
  ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  for (auto& child : children_) {
    read_pipe(child.out_fd, child.out_lines);
    read_pipe(child.err_fd, child.err_lines);
  }
}

void Session::reap() {
  for (auto& child : children_) {
    if (child.reaped) continue;
    int status = 0;
    pid_t rc = ::waitpid(child.exit.pid, &status, WNOHANG);
    if (rc != child.exit.pid) continue;
    child.reaped = true;
    child.exit.signaled = WIFSIGNALED(status);
    child.exit.code = child.exit.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
    if (!child.exit.failed() || stopping_) continue;
    failed_rank_ = child.exit.rank;
    int code = child.exit.signaled ? 128 + child.exit.code : child.exit.code;
    begin_stop(child.exit.describe(), code);
  }
}

void Session::begin_stop(std::string why, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = std::move(why);
  stop_code_ = exit_code;
  kill_at_ = Clock::now() + options_.grace;
  std::vector<int> running;
  for (const auto& child : children_)
    if (!child.reaped) running.push_back(child.exit.rank);
  if (running.empty()) {
    report(stop_reason_);
  } else {
    report(fmt::format("{}; stopping {} {} (SIGTERM, then SIGKILL after {} ms)", stop_reason_,
                       running.size() == 1 ? "rank" : "ranks", fmt::join(running, ", "),
                       options_.grace.count()));
  }
  signal_unreaped(SIGTERM);
}

void Session::signal_unreaped(int signal) {
  // Only children not yet reaped: until we reap it, a child's pid (and so its process group
  // id) cannot be reused by another process.
  for (auto& child : children_) {
    if (child.reaped) continue;
    ::kill(-child.exit.pid, signal);
    child.exit.stopped = true;
  }
}

bool Session::all_reaped() const {
  for (const auto& child : children_)
    if (!child.reaped) return false;
  return true;
}

bool Session::pipes_open() const {
  for (const auto& child : children_)
    if (child.out_fd >= 0 || child.err_fd >= 0) return true;
  return false;
}

void Session::report(const std::string& message) const {
  if (options_.report) {
    options_.report(message);
  } else {
    write_fully(STDERR_FILENO, fmt::format("proxyep launch: {}\n", message));
  }
}

LaunchResult Session::run() {
  SignalScope signals;
  spawn_all();
  const auto start = Clock::now();
  std::optional<Clock::time_point> drain_until;
  while (true) {
    if (all_reaped()) {
      if (!drain_until) drain_until = Clock::now() + kDrain;
      if (!pipes_open() || Clock::now() >= *drain_until) break;
    }
    pump_output(kPollSlice);
    reap();
    if (int signal = SignalScope::pending_stop_signal(); signal != 0 && !stopping_) {
      interrupted_ = true;
      begin_stop(fmt::format("interrupted by signal {} ({})", signal, strsignal(signal)),
                 128 + signal);
    }
    if (options_.timeout.count() > 0 && !stopping_ && Clock::now() - start >= options_.timeout) {
      timed_out_ = true;
      begin_stop(fmt::format("timed out after {:.3g} s", options_.timeout.count() / 1000.0),
                 kTimeoutCode);
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
      killed_ = true;
      signal_unreaped(SIGKILL);
    }
  }
  return finish();
}

LaunchResult Session::finish() {
  LaunchResult result;
  result.master_port = port_;
  result.failed_rank = failed_rank_;
  result.timed_out = timed_out_;
  result.interrupted = interrupted_;
  for (auto& child : children_) {
    // Pipes still held by a leaked grandchild: deliver what we have and let go.
    for (int* fd : {&child.out_fd, &child.err_fd}) {
      if (*fd < 0) continue;
      (fd == &child.out_fd ? child.out_lines : child.err_lines).finish(options_.sink);
      ::close(*fd);
      *fd = -1;
    }
    result.ranks.push_back(child.exit);
  }
  if (!stopping_) return result;
  result.exit_code = stop_code_ != 0 ? stop_code_ : 1;
  result.summary = stop_reason_;
  // Worth telling beyond the first failure: ranks that failed on their own before we stopped
  // them (often the echo of the first failure), and ranks that needed SIGKILL.
  std::vector<std::string> notes;
  for (const auto& exit : result.ranks) {
    if (exit.pid < 0 || !exit.failed() || exit.rank == failed_rank_.value_or(-1)) continue;
    if (!exit.stopped) notes.push_back(exit.describe());
    if (exit.stopped && exit.signaled && exit.code == SIGKILL)
      notes.push_back(fmt::format("rank {} ignored SIGTERM and was killed", exit.rank));
  }
  if (!notes.empty()) report(fmt::format("also: {}", fmt::join(notes, "; ")));
  return result;
}

}  // namespace

std::string RankExit::describe() const {
  if (signaled) return fmt::format("rank {} killed by signal {} ({})", rank, code, strsignal(code));
  return fmt::format("rank {} exited with code {}", rank, code);
}

LocalLauncher::LocalLauncher(LaunchOptions options) : options_(std::move(options)) {
  auto& o = options_;
  require(o.ranks >= 1, "launch", "-n must be at least 1, got {}", o.ranks);
  if (o.ranks_per_node == 0) o.ranks_per_node = o.ranks;
  require(o.ranks_per_node >= 1 && o.ranks % o.ranks_per_node == 0, "launch",
          "--ranks-per-node {} must be at least 1 and divide -n {}", o.ranks_per_node, o.ranks);
  require(!o.command.empty() && !o.command[0].empty(), "launch", "no command to run");
  require(o.timeout.count() >= 0, "launch", "the timeout must not be negative");
  require(o.grace.count() >= 0, "launch", "the grace period must not be negative");
  require(o.master_port >= 0 && o.master_port <= 65535, "launch",
          "MASTER_PORT {} is outside 1..65535", o.master_port);
  if (!o.sink) o.sink = prefixing_sink();
}

LaunchResult LocalLauncher::run() {
  int port = options_.master_port != 0 ? options_.master_port : control::find_free_loopback_port();
  // The job's id and secret, for these ranks only; the secret file goes when the job ends.
  LaunchCredentials credentials;
  LaunchOptions options = options_;
  const auto& ours = credentials.environment();
  options.extra_env.insert(options.extra_env.end(), ours.begin(), ours.end());
  Session session(options, port);
  return session.run();
}

}  // namespace proxyep::tools
