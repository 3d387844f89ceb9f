// The local launcher behind `proxyep launch`, driven directly (no CLI): real child processes.
#include "common/error.hpp"
#include "common/params.hpp"
#include "tools/launch_signals.hpp"
#include "tools/launcher.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace proxyep::tools;
using namespace std::chrono_literals;

namespace {

struct Captured {
  std::map<int, std::vector<std::string>> out;
  std::map<int, std::vector<std::string>> err;
  std::vector<std::string> reports;
};

struct Timed {
  LaunchResult result;
  std::chrono::milliseconds elapsed;
};

Timed launch(LaunchOptions options, Captured& captured) {
  options.sink = [&](int rank, Stream stream, std::string_view line) {
    (stream == Stream::out ? captured.out : captured.err)[rank].emplace_back(line);
  };
  options.report = [&](std::string_view message) { captured.reports.emplace_back(message); };
  auto start = std::chrono::steady_clock::now();
  LocalLauncher launcher(std::move(options));
  auto result = launcher.run();
  return {result, std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)};
}

LaunchOptions shell(int ranks, std::string script) {
  LaunchOptions options;
  options.ranks = ranks;
  options.command = {"sh", "-c", std::move(script)};
  return options;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& line : lines)
    if (line.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("launcher: every rank runs with torchrun's variables and its lines arrive whole") {
  setenv("LAUNCH_TEST_INHERITED", "inherited", 1);
  auto options = shell(4,
                       "echo hi from $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE "
                       "group $GROUP_RANK at $MASTER_ADDR:$MASTER_PORT $LAUNCH_TEST_INHERITED "
                       "$EXTRA; echo to stderr >&2; printf 'no newline'");
  options.ranks_per_node = 2;
  options.extra_env = {{"EXTRA", "extra"}, {"RANK", "must be overridden"}};
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  unsetenv("LAUNCH_TEST_INHERITED");
  CHECK(result.exit_code == 0);
  CHECK(result.summary.empty());
  CHECK(captured.reports.empty());
  REQUIRE(result.master_port > 0);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    auto expected =
        fmt::format("hi from {} of 4 local {}/2 group {} at 127.0.0.1:{} inherited extra", rank,
                    rank % 2, rank / 2, result.master_port);
    CHECK(captured.out[rank] == std::vector<std::string>{expected, "no newline"});
    CHECK(captured.err[rank] == std::vector<std::string>{"to stderr"});
    CHECK(result.ranks[rank].code == 0);
    CHECK_FALSE(result.ranks[rank].signaled);
  }
}

TEST_CASE("launcher: a failing rank stops the others quickly and its code is the result") {
  Captured captured;
  auto [result, elapsed] =
      launch(shell(3, "if [ $RANK = 2 ]; then sleep 0.2; exit 3; fi; exec sleep 30"), captured);
  CHECK(result.exit_code == 3);
  REQUIRE(result.failed_rank.has_value());
  CHECK(*result.failed_rank == 2);
  CHECK(result.summary == "rank 2 exited with code 3");
  CHECK(elapsed < 5s);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    CHECK(result.ranks[rank].stopped);
    CHECK(result.ranks[rank].signaled);
    CHECK(result.ranks[rank].code == SIGTERM);
  }
  REQUIRE_FALSE(captured.reports.empty());
  CHECK(any_contains(captured.reports, "rank 2 exited with code 3; stopping ranks 0, 1 (SIGTERM"));
}

TEST_CASE("launcher: a rank killed by a signal is reported as such") {
  Captured captured;
  auto [result, elapsed] =
      launch(shell(2, "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 30"), captured);
  CHECK(result.exit_code == 128 + 9);
  CHECK(result.failed_rank == 1);
  CHECK(result.summary == "rank 1 was killed by SIGKILL (signal 9)");
  CHECK(elapsed < 5s);
}

TEST_CASE("launcher: tolerated failures leave the others running; one more stops them") {
  Captured captured;
  // Rank 1 is killed; ranks 0 and 2 finish later, unstopped: the launch succeeds, naming rank 1.
  auto options = shell(3, "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 0.5; echo done");
  options.tolerated_failures = 1;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 0);
  CHECK(result.tolerated == std::vector<int>{1});
  CHECK_FALSE(result.failed_rank.has_value());
  CHECK(result.summary == "every rank finished but rank 1, whose failure was tolerated");
  for (int rank : {0, 2}) {
    CAPTURE(rank);
    CHECK_FALSE(result.ranks[rank].stopped);
    CHECK(result.ranks[rank].code == 0);
    CHECK(captured.out[rank] == std::vector<std::string>{"done"});
  }
  CHECK(any_contains(captured.reports,
                     "rank 1 was killed by SIGKILL (signal 9); the other ranks go on (1 of 1"));

  // A second failure beyond the one tolerated stops the rest as usual.
  Captured second;
  options = shell(4, "case $RANK in 1) exit 5;; 2) sleep 0.3; exit 6;; esac; exec sleep 30");
  options.tolerated_failures = 1;
  auto [stopped, took] = launch(options, second);
  CHECK(stopped.exit_code == 6);
  CHECK(stopped.failed_rank == 2);
  CHECK(stopped.tolerated == std::vector<int>{1});
  CHECK(stopped.ranks[0].stopped);
  CHECK(took < 5s);

  auto all = shell(2, "true");
  all.tolerated_failures = 2;  // no rank would be left
  CHECK_THROWS_WITH_AS(LocalLauncher{all}, doctest::Contains("--tolerate-failures"),
                       proxyep::Error);
}

TEST_CASE("launcher: ranks that ignore SIGTERM get SIGKILL after the grace period") {
  auto options = shell(2, "if [ $RANK = 0 ]; then sleep 0.3; exit 5; fi; trap '' TERM; sleep 30");
  options.grace = 300ms;
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 5);
  CHECK(result.ranks[1].signaled);
  CHECK(result.ranks[1].code == SIGKILL);
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 5s);
}

TEST_CASE("launcher: a command that cannot be executed fails clearly") {
  LaunchOptions options;
  options.ranks = 2;
  options.command = {"proxyep-no-such-command-xyz", "--flag"};
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 127);
  CHECK(result.summary.find("could not start 'proxyep-no-such-command-xyz'") != std::string::npos);
  CHECK(result.summary.find("No such file or directory") != std::string::npos);
  CHECK(elapsed < 3s);
}

TEST_CASE("launcher: the timeout stops everything and fails") {
  auto options = shell(2, "echo started; exec sleep 30");
  options.timeout = 400ms;
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 124);
  CHECK(result.timed_out);
  CHECK_FALSE(result.failed_rank.has_value());
  CHECK(result.summary.find("timed out after 0.4 s") == 0);
  CHECK(elapsed >= 400ms);
  CHECK(elapsed < 4s);
  CHECK(captured.out[0] == std::vector<std::string>{"started"});
}

TEST_CASE("launcher: options are checked before anything starts") {
  auto bad = shell(4, "true");
  bad.ranks_per_node = 3;
  CHECK_THROWS_WITH_AS(LocalLauncher{bad}, doctest::Contains("--ranks-per-node 3"), proxyep::Error);
  bad = shell(0, "true");
  CHECK_THROWS_AS(LocalLauncher{bad}, proxyep::Error);
  LaunchOptions empty;
  CHECK_THROWS_WITH_AS(LocalLauncher{empty}, doctest::Contains("no command"), proxyep::Error);
}

TEST_CASE("line splitter: chunks become whole lines; endless lines are cut") {
  std::vector<std::string> lines;
  LineSink sink = [&](int rank, Stream stream, std::string_view line) {
    CHECK(rank == 7);
    CHECK(stream == Stream::err);
    lines.emplace_back(line);
  };
  LineSplitter splitter(7, Stream::err);
  splitter.feed("a", sink);
  splitter.feed("b\nc\n\nd", sink);
  CHECK(lines == std::vector<std::string>{"ab", "c", ""});
  splitter.finish(sink);
  CHECK(lines.back() == "d");
  lines.clear();
  splitter.feed(std::string(LineSplitter::kMaxLine + 10, 'x'), sink);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].size() == LineSplitter::kMaxLine);
  splitter.finish(sink);
  CHECK(lines.back() == std::string(10, 'x'));
}

TEST_CASE("launcher: SIGTERM to the launcher stops the ranks and fails") {
  // The signal arrives while the ranks sleep, so the launcher's handlers are installed.
  std::thread sender([] {
    std::this_thread::sleep_for(300ms);
    std::raise(SIGTERM);
  });
  Captured captured;
  auto [result, elapsed] = launch(shell(2, "exec sleep 30"), captured);
  sender.join();
  CHECK(result.interrupted);
  CHECK(result.exit_code == 128 + SIGTERM);
  CHECK(result.summary == "interrupted by SIGTERM (signal 15)");
  CHECK(result.ranks[0].stopped);
  CHECK(result.ranks[1].stopped);
  CHECK(elapsed < 5s);
}

TEST_CASE("launcher: default variables apply only where the environment lacks them") {
  // FI_TCP_IFACE=lo keeps tcp;ofi_rxm on loopback for local ranks, unless the user chose.
  unsetenv("FI_TCP_IFACE");
  Captured captured;
  auto [result, elapsed] = launch(shell(1, "echo iface=$FI_TCP_IFACE"), captured);
  CHECK(result.exit_code == 0);
  CHECK(captured.out[0] == std::vector<std::string>{"iface=lo"});

  setenv("FI_TCP_IFACE", "eth7", 1);
  Captured chosen;
  auto [result2, elapsed2] = launch(shell(1, "echo iface=$FI_TCP_IFACE"), chosen);
  unsetenv("FI_TCP_IFACE");
  CHECK(result2.exit_code == 0);
  CHECK(chosen.out[0] == std::vector<std::string>{"iface=eth7"});
}

TEST_CASE("launcher: the ranks share a fresh job id and a private secret file, gone afterwards") {
  // Each rank reports the job id, the secret file's path, its mode and its directory's, and the
  // secret's length; never the secret.
  auto script =
      "f=$PROXYEP_BOOTSTRAP_SECRET_FILE; echo \"$PROXYEP_BOOTSTRAP_JOB_ID|$f|$(stat -c %a \"$f\")|"
      "$(stat -c %a \"$(dirname \"$f\")\")|$(stat -c %u \"$f\")|$(wc -c < \"$f\")\"";
  std::vector<std::string> seen;
  for (int launch_index = 0; launch_index < 2; ++launch_index) {
    Captured captured;
    auto [result, elapsed] = launch(shell(2, script), captured);
    REQUIRE(result.exit_code == 0);
    REQUIRE(captured.out[0].size() == 1);
    CHECK(captured.out[1] == captured.out[0]);  // both ranks: the same job and file
    auto fields = captured.out[0][0];
    CAPTURE(fields);
    std::vector<std::string> parts;
    for (size_t start = 0, bar; start <= fields.size(); start = bar + 1) {
      bar = fields.find('|', start);
      if (bar == std::string::npos) bar = fields.size();
      parts.push_back(fields.substr(start, bar - start));
    }
    REQUIRE(parts.size() == 6);
    CHECK(parts[0].rfind("launch-", 0) == 0);
    CHECK(parts[0].size() == 7 + 16);
    CHECK(parts[2] == "600");
    CHECK(parts[3] == "700");
    CHECK(parts[4] == std::to_string(geteuid()));
    CHECK(parts[5] == "64");  // 32 random bytes as hex
    // Removed when the job ended: the file and its directory.
    CHECK_FALSE(std::filesystem::exists(parts[1]));
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(parts[1]).parent_path()));
    seen.push_back(parts[0]);
  }
  CHECK(seen[0] != seen[1]);  // every launch is its own job
}

TEST_CASE("launcher: the secret file is removed when the job fails, too") {
  Captured captured;
  // Rank 1 fails only once rank 0 has printed the file's path (a marker file named after the
  // launch's port says so): the launcher stops rank 0 as soon as rank 1 fails.
  auto [result, elapsed] =
      launch(shell(2,
                   "ready=/tmp/proxyep-secret-test-$MASTER_PORT.ready; if [ $RANK = 0 ]; then "
                   "echo $PROXYEP_BOOTSTRAP_SECRET_FILE; touch $ready; exec sleep 30; fi; "
                   "for i in $(seq 300); do [ -e $ready ] && break; sleep 0.1; done; rm -f $ready; "
                   "exit 4"),
             captured);
  CHECK(result.exit_code == 4);
  REQUIRE_FALSE(captured.out[0].empty());
  CHECK_FALSE(captured.out[0][0].empty());
  CHECK_FALSE(std::filesystem::exists(captured.out[0][0]));
}

TEST_CASE("launcher: a job id and secret the user configured are left to the ranks") {
  proxyep::params::bootstrap_job_id.set("users-job", proxyep::config::Source::environment);
  proxyep::params::bootstrap_secret_file.set("/some/file", proxyep::config::Source::environment);
  Captured captured;
  auto [result, elapsed] = launch(shell(1,
                                        "echo \"[${PROXYEP_BOOTSTRAP_JOB_ID:-unset}] "
                                        "[${PROXYEP_BOOTSTRAP_SECRET_FILE:-unset}]\""),
                                  captured);
  proxyep::params::bootstrap_job_id.reset();
  proxyep::params::bootstrap_secret_file.reset();
  CHECK(result.exit_code == 0);
  // The launcher adds neither (its own environment, which the ranks inherit, has the user's).
  CHECK(captured.out[0] == std::vector<std::string>{"[unset] [unset]"});
}

TEST_CASE("launcher: more ranks than the machine's cap are refused before anything starts") {
  auto many = shell(100000, "true");
  CHECK_THROWS_WITH_AS(LocalLauncher{many},
                       doctest::Contains("100000 ranks are more than the 256 this machine is "
                                         "allowed to run (launch.max_ranks"),
                       proxyep::Error);
  // The cap is the launch.max_ranks parameter, or the options' own.
  auto some = shell(300, "true");
  CHECK_THROWS_AS(LocalLauncher{some}, proxyep::Error);
  proxyep::params::launch_max_ranks.set(300);
  CHECK_NOTHROW(LocalLauncher{some});
  proxyep::params::launch_max_ranks.reset();
  some.max_ranks = 300;
  CHECK_NOTHROW(LocalLauncher{some});
  some.max_ranks = 299;
  CHECK_THROWS_WITH_AS(LocalLauncher{some}, doctest::Contains("more than the 299"), proxyep::Error);
}

TEST_CASE("launcher: the open-file limit is raised for two pipes per rank, or the launch refused") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 200) return;  // nothing to raise to
  rlimit low = saved;
  low.rlim_cur = 100;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto options = shell(64, "true");
  CHECK_NOTHROW(LocalLauncher{options});  // 64 ranks need 2 x 64 + 64 descriptors
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur >= 192);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 2 * 65536) {
    auto huge = shell(65536, "true");
    huge.max_ranks = 65536;
    CHECK_THROWS_WITH_AS(LocalLauncher{huge}, doctest::Contains("(ulimit -n)"), proxyep::Error);
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
}

TEST_CASE("launcher: SIGTERM while ranks are still starting stops the spawning at once") {
  // Rank 0 sends SIGTERM to the launcher (its parent) as soon as it runs; the other ranks would
  // sleep. The launcher must start no rank after the signal, stop those it started and reap them.
  constexpr int kRanks = 256;
  auto options = shell(kRanks, "[ \"$RANK\" = 0 ] && kill -TERM $PPID; exec sleep 30");
  options.grace = 1000ms;
  Captured captured;
  // A named result (not a structured binding: Clang 14 cannot capture those in CAPTURE's lambda).
  const auto launched = launch(options, captured);
  const auto& result = launched.result;
  CHECK(result.interrupted);
  CHECK(result.exit_code == 128 + SIGTERM);
  CHECK(result.summary == "interrupted by SIGTERM (signal 15)");
  CAPTURE(result.started);
  CHECK(result.started >= 1);
  CHECK(result.started < kRanks);
  REQUIRE(result.ranks.size() == size_t{kRanks});
  for (const auto& exit : result.ranks) {
    CAPTURE(exit.rank);
    if (exit.rank >= result.started) {
      CHECK(exit.pid == -1);  // never started
      continue;
    }
    CHECK(exit.pid > 0);
    CHECK(exit.stopped);
    // Reaped, so gone (a reaped pid might be reused, but not this quickly by a live process of
    // ours; ESRCH is what a reaped child gives).
    CHECK((::kill(exit.pid, 0) != 0 && errno == ESRCH));
  }
  CHECK(any_contains(captured.reports, "not started"));
  CHECK(launched.elapsed < 10s);
}

TEST_CASE("launcher: a rank that crashes after the stop request is reported with its signal") {
  // Rank 1 fails once rank 0 has set its trap; rank 0 answers the launcher's SIGTERM by crashing
  // (SIGSEGV). The ready file is named after this launch's port, unique while it runs.
  auto options = shell(2,
                       "ready=/tmp/proxyep-launcher-test-$MASTER_PORT.ready; "
                       "if [ $RANK = 1 ]; then "
                       "  for i in $(seq 300); do [ -e $ready ] && break; sleep 0.1; done; "
                       "  rm -f $ready; exit 3; "
                       "fi; "
                       "ulimit -c 0; trap 'kill -SEGV $$' TERM; touch $ready; sleep 30 & wait");
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 3);
  CHECK(result.summary == "rank 1 exited with code 3");
  CHECK(result.ranks[0].stopped);
  CHECK(result.ranks[0].signaled);
  CHECK(result.ranks[0].code == SIGSEGV);
  CHECK(any_contains(captured.reports, "rank 0 was killed by SIGSEGV after the stop request"));
  CHECK(elapsed < 20s);
}

TEST_CASE("launcher: a rank that crashes on its own is named with its signal") {
  Captured captured;
  auto [result, elapsed] = launch(
      shell(2, "if [ $RANK = 1 ]; then ulimit -c 0; kill -SEGV $$; fi; exec sleep 30"), captured);
  CHECK(result.exit_code == 128 + SIGSEGV);
  CHECK(result.summary == "rank 1 was killed by SIGSEGV (signal 11)");
  // A shell that reports its command's crash as 128 + N is decoded too.
  RankExit shell_report;
  shell_report.rank = 4;
  shell_report.code = 128 + SIGBUS;
  CHECK(shell_report.describe() ==
        "rank 4 exited with code 135 (as a shell reports a command killed by SIGBUS)");
  CHECK(signal_name(SIGTERM) == "SIGTERM");
}

TEST_CASE("launcher: shm regions a dead rank left are removed, and only those") {
  // What libfabric's shm provider leaves when a process dies with an endpoint open: a file named
  // "<pid>:..." in /dev/shm. Rank 0 leaves one and exits 0 (as _exit does), rank 1 leaves one
  // and is killed; a region named after a live process (this one) must stay.
  const std::string ours = fmt::format("/dev/shm/{}:launcher-test:0", ::getpid());
  { std::ofstream(ours) << "ours"; }
  // Rank 1 is killed only once rank 0 has made its region and exited (else the launcher could
  // stop rank 0 before it made one).
  auto options = shell(2,
                       "echo region > /dev/shm/$$:launcher-test:0; "
                       "done=/tmp/proxyep-launcher-test-$MASTER_PORT.done; "
                       "if [ $RANK = 0 ]; then touch $done; exit 0; fi; "
                       "for i in $(seq 300); do [ -e $done ] && break; sleep 0.1; done; "
                       "rm -f $done; kill -9 $$");
  Captured captured;
  auto [result, elapsed] = launch(options, captured);
  CHECK(result.exit_code == 128 + 9);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const auto& exit = result.ranks[rank];
    std::string region = fmt::format("/dev/shm/{}:launcher-test:0", exit.pid);
    CAPTURE(fmt::format("{}", fmt::join(exit.removed_regions, ", ")));
    // Contains, not equals: a region an earlier process with this pid left goes too.
    CHECK(std::find(exit.removed_regions.begin(), exit.removed_regions.end(), region) !=
          exit.removed_regions.end());
    CHECK_FALSE(std::filesystem::exists(region));
    CHECK(any_contains(captured.reports, region));
    CHECK(any_contains(
        captured.reports,
        fmt::format("named after rank {}'s pid {}, which has exited", rank, exit.pid)));
  }
  CHECK(std::filesystem::exists(ours));
  std::filesystem::remove(ours);
}

TEST_CASE("launcher: a placement runs each node's ranks behind its prefix, at its address") {
  // The testbed's placement (tools/testbed/testbed_launch.hpp) with `env` standing in for
  // `nsenter`: it execs the rank in place, as nsenter does.
  LaunchOptions options = shell(4, "echo rank $RANK node $NODE_MARK master $MASTER_ADDR $PLACED");
  options.ranks_per_node = 2;
  options.extra_env = {{"PLACED", "from extra_env"}};
  Captured captured;
  options.sink = [&](int rank, Stream stream, std::string_view line) {
    (stream == Stream::out ? captured.out : captured.err)[rank].emplace_back(line);
  };
  LocalLauncher launcher(options);
  CHECK(launcher.nodes() == 2);
  NodePlacement placement;
  placement.enter = {{"env", "NODE_MARK=n0"}, {"env", "NODE_MARK=n1"}};
  placement.master_addr = "10.200.0.1";
  placement.env = {{"PLACED", "placed"}};  // over extra_env
  launcher.place(placement);
  CHECK(launcher.run().exit_code == 0);
  for (int rank = 0; rank < 4; ++rank)
    CHECK(captured.out[rank] == std::vector<std::string>{fmt::format(
                                    "rank {} node n{} master 10.200.0.1 placed", rank, rank / 2)});
  placement.enter.pop_back();  // one prefix for two nodes
  CHECK_THROWS_WITH_AS(launcher.place(placement), doctest::Contains("a placement of 1 nodes"),
                       proxyep::Error);
}

TEST_CASE("launcher: a stop signal recorded by an enclosing scope starts no rank") {
  // The testbed's scope encloses the launcher's (tools/testbed/testbed_launch.cpp): a SIGTERM
  // that lands between the two must still stop the launch, not be forgotten.
  SignalScope outer;
  std::raise(SIGTERM);
  REQUIRE(SignalScope::pending_stop_signal() == SIGTERM);
  Captured captured;
  auto [result, elapsed] = launch(shell(2, "exec sleep 30"), captured);
  CHECK(result.interrupted);
  CHECK(result.exit_code == 128 + SIGTERM);
  CHECK(result.started == 0);
  CHECK(elapsed < 5s);
}
