#include "tools/launcher.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "control/tcp_socket.hpp"
#include "fabric/shm_stale.hpp"
#include "tools/launch_credentials.hpp"
#include "tools/launch_signals.hpp"
#include "tools/spawn_rank.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
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
// Ranks spawned per turn of the loop; between turns it reads output, reaps and looks at signals,
// so a stop request or a failing rank ends the spawning within one batch.
constexpr int kSpawnBatch = 8;
// File descriptors the launcher keeps besides two pipes per rank (stdio, sockets, libraries).
constexpr rlim_t kSpareDescriptors = 64;

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

// "0-3, 5, 6, 8-11": runs of three or more become ranges, so rank lists stay short however
// many ranks there are.
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (j - i >= 2) {
      parts.push_back(fmt::format("{}-{}", ranks[i], ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k)
        parts.push_back(std::to_string(ranks[k]));
    }
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string ranks_word(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank" : "ranks";
}

// Two pipes per rank stay open in the launcher: raise the soft limit on open files up to the
// hard one if that is needed, or refuse before anything starts.
void ensure_descriptors(int ranks) {
  const rlim_t needed = 2 * static_cast<rlim_t>(ranks) + kSpareDescriptors;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= needed)
    return;
  require(limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed, "launch",
          "{} ranks need {} open files in the launcher (two pipes each), but the limit is {} "
          "(ulimit -n)",
          ranks, needed, limit.rlim_max);
  rlimit raised = limit;
  raised.rlim_cur = needed;
  require(::setrlimit(RLIMIT_NOFILE, &raised) == 0, "launch",
          "{} ranks need {} open files in the launcher; raising the limit from {} failed: {}",
          ranks, needed, limit.rlim_cur, control::errno_text(errno));
}

// One run of the launcher: the children, their pipes, and the stop sequence.
class LaunchedJob {
 public:
  LaunchedJob(const LaunchOptions& options, const NodePlacement* placement, int port)
      : options_(options), placement_(placement), port_(port) {
    for (int rank = 0; rank < options.ranks; ++rank)
      children_.emplace_back(rank);
  }
  LaunchResult run();

 private:
  std::vector<std::string> environment_for(int rank) const;
  int spawn(Child& child);  // 0 or the errno of the failed spawn
  void spawn_batch();
  bool spawning() const { return !stopping_ && next_ < children_.size(); }
  void pump_output(std::chrono::milliseconds wait);
  void read_pipe(int& fd, LineSplitter& lines);
  void reap();
  void collect(Child& child, int status);
  void begin_stop(std::string why, int exit_code);
  void signal_unreaped(int signal);
  bool all_reaped() const;
  bool pipes_open() const;
  void report(const std::string& message) const;
  LaunchResult finish();

  const LaunchOptions& options_;
  const NodePlacement* placement_;  // null: every rank in this host's network
  int port_;
  std::vector<Child> children_;
  size_t next_ = 0;  // the next rank to spawn
  bool stopping_ = false;
  std::vector<int> tolerated_;  // ranks whose failure was tolerated, in order
  bool killed_ = false;
  Clock::time_point kill_at_{};
  std::string stop_reason_;
  int stop_code_ = 0;
  std::optional<int> failed_rank_;
  bool timed_out_ = false;
  bool interrupted_ = false;
};

std::vector<std::string> LaunchedJob::environment_for(int rank) const {
  const int per_node = options_.ranks_per_node;
  std::vector<std::pair<std::string, std::string>> ours = options_.extra_env;
  if (placement_ != nullptr)
    ours.insert(ours.end(), placement_->env.begin(), placement_->env.end());
  ours.insert(ours.end(), {{"MASTER_ADDR", placement_ ? placement_->master_addr : "127.0.0.1"},
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

int LaunchedJob::spawn(Child& child) {
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
  std::vector<std::string> command;
  if (placement_ != nullptr) command = placement_->enter.at(rank / options_.ranks_per_node);
  command.insert(command.end(), options_.command.begin(), options_.command.end());
  pid_t pid = -1;
  int rc = spawn_rank(command, environment_for(rank), out[1], err[1], pid);
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

void LaunchedJob::spawn_batch() {
  for (int n = 0; n < kSpawnBatch && spawning(); ++n) {
    // A stop request ends the spawning before the next rank, not after the last one.
    if (SignalScope::pending_stop_signal() != 0) return;
    Child& child = children_[next_++];
    int error = spawn(child);
    if (error == 0) continue;
    begin_stop(fmt::format("rank {} could not start '{}': {}", child.exit.rank, options_.command[0],
                           control::errno_text(error)),
               kExecFailedCode);
    return;
  }
}

void LaunchedJob::read_pipe(int& fd, LineSplitter& lines) {
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

void LaunchedJob::pump_output(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, bool>> owners;  // (child, is stdout) of each entry of fds
  for (auto& child : children_) {
    if (child.out_fd >= 0) {
      fds.push_back({child.out_fd, POLLIN, 0});
      owners.emplace_back(&child, true);
    }
    if (child.err_fd >= 0) {
      fds.push_back({child.err_fd, POLLIN, 0});
      owners.emplace_back(&child, false);
    }
  }
  // EINTR (SIGCHLD, SIGINT) just ends the wait early; the caller looks at what happened.
  if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    auto [child, out] = owners[i];
    if (out)
      read_pipe(child->out_fd, child->out_lines);
    else
      read_pipe(child->err_fd, child->err_lines);
  }
}

void LaunchedJob::reap() {
  for (auto& child : children_) {
    if (child.reaped) continue;
    // Look without reaping: until waitpid() below, the exited rank is a zombie whose pid no
    // other process can get, so the shm regions named after it are certainly its leftovers.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(child.exit.pid), &info, WEXITED | WNOHANG | WNOWAIT) !=
            0 ||
        info.si_pid != child.exit.pid)
      continue;
    child.exit.removed_regions = fabric::remove_shm_regions_of(child.exit.pid);
    int status = 0;
    if (::waitpid(child.exit.pid, &status, 0) != child.exit.pid) continue;
    collect(child, status);
  }
}

void LaunchedJob::collect(Child& child, int status) {
  child.reaped = true;
  RankExit& exit = child.exit;
  exit.signaled = WIFSIGNALED(status);
  exit.code = exit.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  if (exit.failed() && !stopping_) {
    if (static_cast<int>(tolerated_.size()) < options_.tolerated_failures) {
      tolerated_.push_back(exit.rank);
      report(fmt::format("{}; the other ranks go on ({} of {} tolerated failures)", exit.describe(),
                         tolerated_.size(), options_.tolerated_failures));
    } else {
      failed_rank_ = exit.rank;
      begin_stop(exit.describe(), exit.signaled ? 128 + exit.code : exit.code);
    }
  }
  if (!exit.removed_regions.empty())
    report(fmt::format("removed {}: shm {} named after rank {}'s pid {}, which has exited",
                       fmt::join(exit.removed_regions, ", "),
                       exit.removed_regions.size() == 1 ? "region" : "regions", exit.rank,
                       exit.pid));
}

void LaunchedJob::begin_stop(std::string why, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = std::move(why);
  stop_code_ = exit_code;
  kill_at_ = Clock::now() + options_.grace;
  std::vector<int> running, unstarted;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!children_[i].reaped) running.push_back(static_cast<int>(i));
    if (i >= next_) unstarted.push_back(static_cast<int>(i));
  }
  std::string message = stop_reason_;
  if (!running.empty())
    message += fmt::format("; stopping {} {} (SIGTERM, then SIGKILL after {} ms)",
                           ranks_word(running), rank_list(running), options_.grace.count());
  if (!unstarted.empty())
    message += fmt::format("; {} {} not started", ranks_word(unstarted), rank_list(unstarted));
  report(message);
  signal_unreaped(SIGTERM);
}

void LaunchedJob::signal_unreaped(int signal) {
  // Only children not yet reaped: until we reap it, a child's pid (and so its process group
  // id) cannot be reused by another process.
  for (auto& child : children_) {
    if (child.reaped) continue;
    ::kill(-child.exit.pid, signal);
    child.exit.stopped = true;
  }
}

bool LaunchedJob::all_reaped() const {
  for (const auto& child : children_)
    if (!child.reaped) return false;
  return true;
}

bool LaunchedJob::pipes_open() const {
  for (const auto& child : children_)
    if (child.out_fd >= 0 || child.err_fd >= 0) return true;
  return false;
}

void LaunchedJob::report(const std::string& message) const {
  if (options_.report) {
    options_.report(message);
  } else {
    write_fully(STDERR_FILENO, fmt::format("proxyep launch: {}\n", message));
  }
}

LaunchResult LaunchedJob::run() {
  SignalScope signals;
  const auto start = Clock::now();
  std::optional<Clock::time_point> drain_until;
  while (true) {
    spawn_batch();
    if (!spawning() && all_reaped()) {
      if (!drain_until) drain_until = Clock::now() + kDrain;
      if (!pipes_open() || Clock::now() >= *drain_until) break;
    }
    // While ranks remain to be started, only look at what is ready: no waiting.
    pump_output(spawning() ? std::chrono::milliseconds(0) : kPollSlice);
    reap();
    if (int signal = SignalScope::pending_stop_signal(); signal != 0 && !stopping_) {
      interrupted_ = true;
      begin_stop(fmt::format("interrupted by {} (signal {})", signal_name(signal), signal),
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

LaunchResult LaunchedJob::finish() {
  LaunchResult result;
  result.master_port = port_;
  result.failed_rank = failed_rank_;
  result.timed_out = timed_out_;
  result.interrupted = interrupted_;
  result.started = static_cast<int>(next_);
  result.tolerated = tolerated_;
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
  if (!stopping_) {
    if (!tolerated_.empty()) {
      result.summary = fmt::format("every rank finished but {} {}, whose failure was tolerated",
                                   ranks_word(tolerated_), rank_list(tolerated_));
      report(result.summary);
    }
    return result;
  }
  result.exit_code = stop_code_ != 0 ? stop_code_ : 1;
  result.summary = stop_reason_;
  // Worth telling beyond the first failure: ranks that failed on their own before we stopped
  // them (often the echo of the first failure), ranks that needed SIGKILL, and ranks that died
  // by some other signal once asked to stop (a crash in a shutdown path is still a crash).
  std::vector<std::string> notes;
  for (const auto& exit : result.ranks) {
    if (exit.pid < 0 || !exit.failed() || exit.rank == failed_rank_.value_or(-1)) continue;
    if (!exit.stopped) {
      notes.push_back(exit.describe());
    } else if (exit.signaled && exit.code == SIGKILL && killed_) {
      notes.push_back(fmt::format("rank {} ignored SIGTERM and was killed", exit.rank));
    } else if (exit.signaled && exit.code != SIGTERM) {
      notes.push_back(fmt::format("rank {} was killed by {} after the stop request", exit.rank,
                                  signal_name(exit.code)));
    }
  }
  if (!notes.empty()) report(fmt::format("also: {}", fmt::join(notes, "; ")));
  return result;
}

}  // namespace

std::string signal_name(int signal) {
  if (const char* abbreviation = ::sigabbrev_np(signal)) return fmt::format("SIG{}", abbreviation);
  return fmt::format("signal {}", signal);
}

std::string RankExit::describe() const {
  if (signaled)
    return fmt::format("rank {} was killed by {} (signal {})", rank, signal_name(code), code);
  // A shell reports a child killed by signal N as its exit code 128 + N.
  if (code > 128 && ::sigabbrev_np(code - 128) != nullptr)
    return fmt::format("rank {} exited with code {} (as a shell reports a command killed by {})",
                       rank, code, signal_name(code - 128));
  return fmt::format("rank {} exited with code {}", rank, code);
}

LocalLauncher::LocalLauncher(LaunchOptions options) : options_(std::move(options)) {
  auto& o = options_;
  require(o.ranks >= 1, "launch", "-n must be at least 1, got {}", o.ranks);
  if (o.max_ranks == 0) o.max_ranks = static_cast<int>(params::launch_max_ranks.get());
  require(o.ranks <= o.max_ranks, "launch",
          "{} ranks are more than the {} this machine is allowed to run (launch.max_ranks; raise "
          "it with `proxyep launch --max-ranks N` or PROXYEP_LAUNCH_MAX_RANKS=N)",
          o.ranks, o.max_ranks);
  if (o.ranks_per_node == 0) o.ranks_per_node = o.ranks;
  require(o.ranks_per_node >= 1 && o.ranks % o.ranks_per_node == 0, "launch",
          "--ranks-per-node {} must be at least 1 and divide -n {}", o.ranks_per_node, o.ranks);
  require(!o.command.empty() && !o.command[0].empty(), "launch", "no command to run");
  require(o.timeout.count() >= 0, "launch", "the timeout must not be negative");
  require(o.grace.count() >= 0, "launch", "the grace period must not be negative");
  require(o.tolerated_failures >= 0 && o.tolerated_failures < o.ranks, "launch",
          "--tolerate-failures must be in [0, {}) (at least one rank must be left); got {}",
          o.ranks, o.tolerated_failures);
  require(o.master_port >= 0 && o.master_port <= 65535, "launch",
          "MASTER_PORT {} is outside 1..65535", o.master_port);
  if (!o.sink) o.sink = prefixing_sink();
  ensure_descriptors(o.ranks);
}

LaunchResult LocalLauncher::run() {
  int port = options_.master_port != 0 ? options_.master_port : control::find_free_loopback_port();
  // The job's id and secret, for these ranks only; the secret file goes when the job ends.
  LaunchCredentials credentials;
  LaunchOptions options = options_;
  const auto& ours = credentials.environment();
  options.extra_env.insert(options.extra_env.end(), ours.begin(), ours.end());
  LaunchedJob job(options, placement_ ? &*placement_ : nullptr, port);
  return job.run();
}

void LocalLauncher::place(NodePlacement placement) {
  require(static_cast<int>(placement.enter.size()) == nodes(), "launch",
          "a placement of {} nodes for {} ranks of {} per node", placement.enter.size(),
          options_.ranks, options_.ranks_per_node);
  placement_ = std::move(placement);
}

}  // namespace proxyep::tools
