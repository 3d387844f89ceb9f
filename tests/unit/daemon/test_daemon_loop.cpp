// The daemon's poll loop in this process, over a real Unix socket in a fresh temporary
// directory (no signals: request_drain() stands in for SIGTERM; no metrics). Every wait below
// is a poll with a deadline on a socket or on the daemon's thread, never a sleep.
#include "common/error.hpp"
#include "control/daemon_frames.hpp"
#include "control/unix_socket.hpp"
#include "daemon/daemon.hpp"
#include "daemon/status_client.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

using namespace proxyep;
using namespace proxyep::daemon;
using namespace std::chrono_literals;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "proxyepd-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

DaemonOptions options_for(const std::filesystem::path& socket) {
  DaemonOptions o;
  o.socket_path = socket.string();
  o.handle_signals = false;
  o.io_timeout = 5000ms;
  o.drain_timeout = 5000ms;
  return o;
}

// A daemon serving on its own thread; drained and joined when the test ends.
class Running {
 public:
  explicit Running(DaemonOptions options) : daemon_(std::move(options)) {
    done_ = std::async(std::launch::async, [this] { daemon_.run(); });
  }
  ~Running() { stop(); }
  Daemon& daemon() { return daemon_; }
  // Requests the drain; true when run() returned within `limit`.
  bool stop(std::chrono::milliseconds limit = 10000ms) {
    if (!done_.valid()) return true;
    daemon_.request_drain();
    if (done_.wait_for(limit) != std::future_status::ready) return false;
    done_.get();
    return true;
  }

 private:
  Daemon daemon_;
  std::future<void> done_;
};

control::Socket connect_raw(const std::string& path) {
  int error = 0;
  control::Socket s = control::connect_unix(path, Deadline(2000ms), error);
  REQUIRE_MESSAGE(error == 0, "connect: ", control::connect_error_text(error));
  return s;
}

// Everything the daemon sends until it closes (or `limit` passes: then the test fails).
std::string read_until_closed(const control::Socket& s, std::chrono::milliseconds limit) {
  std::string got;
  Deadline deadline(limit);
  for (;;) {
    pollfd fd{s.fd(), POLLIN, 0};
    REQUIRE_MESSAGE(::poll(&fd, 1, static_cast<int>(deadline.remaining().count())) == 1,
                    "the daemon did not close the connection in time");
    char buf[4096];
    const ssize_t n = ::recv(s.fd(), buf, sizeof buf, 0);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
}

nlohmann::json only_frame(const std::string& bytes) {
  control::FrameDecoder decoder;
  decoder.feed({bytes.data(), bytes.size()});
  nlohmann::json message;
  std::string problem;
  REQUIRE(decoder.next(message, problem) == control::FrameDecoder::Result::frame);
  return message;
}

}  // namespace

TEST_CASE("status: welcome then the status frame, counting this connection") {
  TempDir dir;
  const auto socket = dir.path / "run" / "proxyepd.sock";  // run/ is created, mode 0750
  Running running(options_for(socket));
  struct stat st {};
  REQUIRE(::stat(socket.parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0750);
  REQUIRE(::stat(socket.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0660);

  const StatusAnswer answer = query_status(socket.string(), 2000ms);
  CHECK(answer.welcome["daemon_pid"] == ::getpid());
  CHECK(answer.welcome["capabilities"] == nlohmann::json{"status", "attach"});
  const auto& s = answer.status;
  CHECK(s["pid"] == ::getpid());
  CHECK(s["socket"] == socket.string());
  CHECK(s["clients_attached"] == 0);
  CHECK(s["connections"]["accepted"] == 1);
  CHECK(s["draining"] == false);
  CHECK(s["metrics_url"].is_null());
  CHECK(query_status(socket.string(), 2000ms).status["connections"]["accepted"] == 2);

  CHECK(running.stop());
  CHECK_FALSE(std::filesystem::exists(socket));  // removed by the drain
}

TEST_CASE("a stalled client is dropped at its deadline and blocks nobody meanwhile") {
  TempDir dir;
  auto options = options_for(dir.path / "d.sock");
  options.io_timeout = 300ms;
  Running running(options);
  const control::Socket stalled = connect_raw(options.socket_path);
  const char half_header[2] = {10, 0};
  REQUIRE(::send(stalled.fd(), half_header, 2, MSG_NOSIGNAL) == 2);
  // Served while the stalled client holds its connection.
  CHECK(query_status(options.socket_path, 2000ms).status["connections"]["accepted"] == 1);
  CHECK(read_until_closed(stalled, 5000ms).empty());
  CHECK(running.daemon().stats().bad_handshake.load() == 1);
}

TEST_CASE("an oversize frame gets an error frame, then the connection closes") {
  TempDir dir;
  Running running(options_for(dir.path / "d.sock"));
  const control::Socket client = connect_raw(running.daemon().socket_path());
  const char huge[4] = {0, 0, 0, 0x40};  // 1 GiB
  REQUIRE(::send(client.fd(), huge, 4, MSG_NOSIGNAL) == 4);
  const nlohmann::json error = only_frame(read_until_closed(client, 5000ms));
  CHECK(error["proxyep"] == "error");
  CHECK(error["error"] == "a frame of 1073741824 bytes exceeds the limit of 1048576 bytes");
  CHECK(running.daemon().stats().bad_handshake.load() == 1);
}

TEST_CASE("a peer whose uid is not allowed is told why and counted as refused") {
  TempDir dir;
  auto options = options_for(dir.path / "d.sock");
  options.access = AccessPolicy::from_lists("4000000000", "4000000001", ::getuid());
  Running running(options);
  CHECK_THROWS_WITH_AS(
      query_status(options.socket_path, 2000ms),
      doctest::Contains(fmt::format("proxyepd at {} refused this client: uid {} (gid {}) may not "
                                    "use this proxyepd: it serves uids 4000000000 and gids "
                                    "4000000001",
                                    options.socket_path, ::getuid(), ::getgid())
                            .c_str()),
      Error);
  CHECK(running.daemon().stats().refused.load() == 1);
  CHECK(running.daemon().stats().accepted.load() == 0);
}

TEST_CASE("over daemon.max_connections, new connections wait in the backlog") {
  TempDir dir;
  auto options = options_for(dir.path / "d.sock");
  options.max_connections = 1;
  Running running(options);
  control::Socket holder = connect_raw(options.socket_path);
  // Make sure the holder was accepted (it is the one slot) before the next client comes: its
  // cut-short hello is answered only by the daemon, after accepting it.
  const char bad[8] = {1, 0, 0, 0, '[', 0, 0, 0};
  REQUIRE(::send(holder.fd(), bad, 5, MSG_NOSIGNAL) == 5);
  CHECK(only_frame(read_until_closed(holder, 5000ms))["proxyep"] == "error");
  // The daemon now waits for the holder to close (stage closing): the slot stays taken.
  CHECK_THROWS_WITH_AS(query_status(options.socket_path, 300ms),
                       doctest::Contains("did not send its welcome within 300 ms"), Error);
  holder.close();
  // (The client that gave up is accepted too once the slot frees: its hello was queued.)
  CHECK(query_status(options.socket_path, 5000ms).status["pid"] == ::getpid());
}

TEST_CASE("the drain stops accepting at once and gives connections in progress its deadline") {
  TempDir dir;
  auto options = options_for(dir.path / "d.sock");
  options.io_timeout = 60000ms;  // the stalled client would hold its connection for a minute
  options.drain_timeout = 200ms;
  Running running(options);
  const control::Socket stalled = connect_raw(options.socket_path);
  // Accepted (the status query after it is served in order) before the drain begins.
  CHECK(query_status(options.socket_path, 2000ms).status["connections"]["accepted"] == 1);
  const auto start = std::chrono::steady_clock::now();
  CHECK(running.stop());
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(running.daemon().stats().draining.load());
  CHECK_FALSE(std::filesystem::exists(options.socket_path));
  CHECK(read_until_closed(stalled, 2000ms).empty());
  // The path is free again: a new daemon takes it.
  Running next(options);
  CHECK(query_status(options.socket_path, 2000ms).status["pid"] == ::getpid());
}

TEST_CASE("taking the path: served, stale, or not a socket") {
  TempDir dir;
  const auto options = options_for(dir.path / "d.sock");
  {
    Running first(options);
    CHECK_THROWS_WITH_AS(
        Daemon{options},
        doctest::Contains(("another proxyepd serves " + options.socket_path).c_str()), Error);
    CHECK(query_status(options.socket_path, 2000ms).status["pid"] == ::getpid());  // untouched
  }
  {  // A socket file nobody listens on (what a SIGKILLed daemon leaves) is replaced.
    const control::UnixAddress a = control::unix_address(options.socket_path, "test");
    control::Socket left(::socket(AF_UNIX, SOCK_STREAM, 0));
    REQUIRE(::bind(left.fd(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) == 0);
    left.close();
    REQUIRE(std::filesystem::exists(options.socket_path));
    CHECK_THROWS_WITH_AS(query_status(options.socket_path, 2000ms),
                         doctest::Contains("connection refused"), Error);
    Running replaced(options);
    CHECK(query_status(options.socket_path, 2000ms).status["pid"] == ::getpid());
  }
  std::ofstream(options.socket_path) << "not a socket";
  CHECK_THROWS_WITH_AS(Daemon{options}, doctest::Contains("exists and is not a socket"), Error);
  CHECK(std::filesystem::is_regular_file(options.socket_path));  // never removed
}

TEST_CASE("no daemon: the status client fails at once naming the path") {
  TempDir dir;
  const std::string path = (dir.path / "none.sock").string();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(query_status(path, 2000ms),
                       doctest::Contains(("no proxyepd at " + path + ": no such file").c_str()),
                       Error);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
}
