// A client's connection to the node daemon (control/daemon_connection.hpp) against a scripted
// stand-in: a thread in this process listening on a Unix socket in a fresh temporary directory,
// speaking frames (control/daemon_frames.hpp) the way each test needs. Every wait on either side
// is a poll with a deadline; the server thread is joined on every path (its waits also end when
// the test signals it to stop), and what it saw is read only after the join.
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/daemon_connection.hpp"
#include "control/daemon_frames.hpp"
#include "control/daemon_handshake.hpp"
#include "control/fd_passing.hpp"
#include "control/unix_socket.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace std::chrono_literals;
using nlohmann::json;
using proxyep::control::ClientKind;
using proxyep::control::DaemonConnection;

namespace {

constexpr const char* kPhase = "test.daemon";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "proxyep-conn-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The server's end of one client connection. Every wait polls the socket and the test's stop
// signal with a 5 s deadline; failures throw (the script's error, reported by finish()).
class Peer {
 public:
  Peer(int fd, int stop) : fd_(fd), stop_(stop) {}
  ~Peer() { close(); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // The next frame; descriptors that came with it go to `fds` (or are closed).
  json read(std::vector<int>* fds = nullptr) {
    for (;;) {
      json message;
      std::string problem;
      switch (decoder_.next(message, problem)) {
        case control::FrameDecoder::Result::frame:
          return message;
        case control::FrameDecoder::Result::error:
          throw std::runtime_error("server: bad frame from the client: " + problem);
        case control::FrameDecoder::Result::need_more:
          break;
      }
      if (!wait_readable()) throw std::runtime_error("server: stopped while reading a frame");
      std::vector<int> got;
      char buffer[4096];
      const ssize_t n = control::receive_with_fds(fd_, buffer, got);
      for (int fd : got)
        fds != nullptr ? fds->push_back(fd) : (void)::close(fd);
      if (n == 0) throw std::runtime_error("server: the client closed while a frame was awaited");
      if (n < 0 && errno != EINTR) throw std::runtime_error("server: recvmsg failed");
      if (n > 0) decoder_.feed({buffer, static_cast<size_t>(n)});
    }
  }

  void send(const json& message) { send_together({message}); }
  // The frames of `messages` in one send(): they reach the client's socket buffer together.
  void send_together(const std::vector<json>& messages) {
    std::string frame;
    for (const json& message : messages)
      frame += control::encode_frame(message);
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("server: send failed");
      sent += static_cast<size_t>(n);
    }
  }

  // Keeps the connection open, answering nothing, until the client closes it or the test
  // signals stop.
  void hold() {
    for (;;) {
      if (!wait_readable()) return;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n == 0) return;
      if (n < 0 && errno != EINTR) throw std::runtime_error("server: recv failed");
    }
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  // True when the socket is readable; false on the stop signal; throws at the deadline.
  bool wait_readable() {
    const Deadline deadline(5000ms);
    for (;;) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_, POLLIN, 0}};
      const int rc = ::poll(fds, 2, static_cast<int>(deadline.remaining().count()));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) throw std::runtime_error("server: poll failed");
      if (fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;
      if (deadline.expired()) throw std::runtime_error("server: the client sent nothing in 5 s");
    }
  }

  int fd_;
  int stop_;
  control::FrameDecoder decoder_;
};

// A listener at `dir`/proxyepd.sock (listening before the constructor returns) whose thread
// accepts one client and runs `script` on it.
class FakeDaemon {
 public:
  FakeDaemon(const TempDir& dir, std::function<void(Peer&)> script)
      : path_((dir.path / "proxyepd.sock").string()) {
    stop_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    REQUIRE(stop_ >= 0);
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    REQUIRE(listener_ >= 0);
    const control::UnixAddress address = control::unix_address(path_, kPhase);
    REQUIRE(::bind(listener_, reinterpret_cast<const sockaddr*>(&address.addr), address.len) == 0);
    REQUIRE(::listen(listener_, 4) == 0);
    thread_ = std::thread([this, script = std::move(script)] {
      try {
        Peer peer(accept_one(), stop_);
        script(peer);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
  }
  ~FakeDaemon() {
    finish();
    ::close(listener_);
    ::close(stop_);
  }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  const std::string& path() const { return path_; }
  // Signals stop (ending a hold() or any wait still running), joins the thread and returns
  // what went wrong in the script ("" when nothing did).
  std::string finish() {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      (void)!::write(stop_, &one, sizeof one);
      thread_.join();
    }
    return error_;
  }

 private:
  int accept_one() {
    const Deadline deadline(5000ms);
    for (;;) {
      pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_, POLLIN, 0}};
      const int rc = ::poll(fds, 2, static_cast<int>(deadline.remaining().count()));
      if (rc < 0 && errno == EINTR) continue;
      if (fds[1].revents != 0) throw std::runtime_error("server: stopped before a client came");
      if (rc > 0 && fds[0].revents != 0) {
        const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) return fd;
        if (errno != EAGAIN && errno != EINTR) throw std::runtime_error("server: accept failed");
      }
      if (deadline.expired()) throw std::runtime_error("server: no client came in 5 s");
    }
  }

  std::string path_;
  int listener_ = -1;
  int stop_ = -1;
  std::thread thread_;
  std::string error_;  // written by the thread, read after the join
};

// Reads the hello and welcomes it; throws when the first frame is not a hello.
json welcome(Peer& peer) {
  json hello = peer.read();
  if (!control::check_hello(hello).hello)
    throw std::runtime_error("server: the first frame is not a hello: " + hello.dump());
  peer.send(control::welcome_message(4242));
  return hello;
}

// The message of the proxyep::Error `f` throws ("" and a failed check when it does not throw).
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no proxyep::Error was thrown");
  return Error("", "");
}

// Waits (at most 5 s) until the daemon's socket has something to read.
bool readable(const DaemonConnection& connection) {
  pollfd fd{connection.fd(), POLLIN, 0};
  return ::poll(&fd, 1, 5000) == 1;
}

// Calls poll_failure(take) whenever the socket is readable, until `done` or a failure comes
// back, or 5 s pass. Returns what poll_failure returned last.
std::optional<std::string> poll_until(DaemonConnection& connection,
                                      const std::function<bool(const json&)>& take,
                                      const std::function<bool()>& done) {
  const Deadline deadline(5000ms);
  std::optional<std::string> failure;
  while (!done() && !deadline.expired()) {
    pollfd fd{connection.fd(), POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(deadline.remaining().count())) < 0 && errno != EINTR) break;
    failure = connection.poll_failure(take);
    if (failure) break;
  }
  return failure;
}

}  // namespace

TEST_CASE("daemon connection: hello as the given kind, the welcome, a request with an fd") {
  TempDir dir;
  json hello;
  std::vector<std::string> passed;
  json request;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    hello = welcome(peer);
    std::vector<int> fds;
    request = peer.read(&fds);
    for (int fd : fds) {
      char buffer[64];
      const ssize_t n = ::pread(fd, buffer, sizeof buffer, 0);
      passed.emplace_back(buffer, static_cast<size_t>(std::max<ssize_t>(n, 0)));
      ::close(fd);
    }
    peer.send({{"proxyep", "pong"}, {"n", 7}});
  });

  DaemonConnection connection =
      DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase);
  CHECK(connection.welcome()["daemon_pid"] == 4242);
  CHECK(connection.path() == daemon.path());
  const int memfd = ::memfd_create("proxyep-test-conn", MFD_CLOEXEC);
  REQUIRE(memfd >= 0);
  REQUIRE(::write(memfd, "ring bytes", 10) == 10);
  const int fds[] = {memfd};
  const json reply =
      connection.request({{"proxyep", "ping"}, {"rank", 3}}, fds, "pong", Deadline(5000ms), kPhase);
  ::close(memfd);
  CHECK(reply["n"] == 7);

  REQUIRE(daemon.finish() == "");
  const auto checked = control::check_hello(hello);
  REQUIRE(checked.hello);
  CHECK(checked.hello->kind == ClientKind::attach);
  CHECK(checked.hello->pid == ::getpid());
  CHECK(request == json{{"proxyep", "ping"}, {"rank", 3}});
  CHECK(passed == std::vector<std::string>{"ring bytes"});
}

TEST_CASE("daemon connection: no daemon at the path is named") {
  TempDir dir;
  const std::string path = (dir.path / "nobody.sock").string();
  const Error e =
      error_of([&] { DaemonConnection::open(path, ClientKind::status, 2000ms, kPhase); });
  CHECK(e.phase() == kPhase);
  CHECK(contains(e.message(), "no proxyepd at " + path));
}

TEST_CASE("daemon connection: a refused hello is quoted, naming the socket") {
  TempDir dir;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    peer.read();
    peer.send(control::error_message("proxyepd is shutting down"));
    peer.close();
  });
  const Error e =
      error_of([&] { DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase); });
  CHECK(e.phase() == kPhase);
  CHECK(contains(e.message(), "proxyepd at " + daemon.path() +
                                  " refused this client: proxyepd is shutting down"));
  CHECK(daemon.finish() == "");
}

TEST_CASE("daemon connection: a hello answered with anything but a welcome") {
  TempDir dir;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    peer.read();
    peer.send({{"proxyep", "status"}});
    peer.hold();
  });
  const Error e =
      error_of([&] { DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase); });
  CHECK(contains(e.message(), "proxyepd at " + daemon.path() +
                                  " answered the hello with a 'status' message, not a welcome"));
  CHECK(daemon.finish() == "");
}

TEST_CASE("daemon connection: request fails on a reply of another type and on an error reply") {
  TempDir dir;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    welcome(peer);
    peer.read();  // connect
    peer.send({{"proxyep", "arenas_added"}});
    peer.read();  // start
    peer.send(control::error_message("rank 3 is already attached"));
    peer.hold();
  });
  DaemonConnection connection =
      DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase);

  Error e = error_of([&] {
    connection.request({{"proxyep", "connect"}}, {}, "connected", Deadline(5000ms), kPhase);
  });
  CHECK(e.phase() == kPhase);
  CHECK(contains(e.message(), "proxyepd at " + daemon.path() +
                                  " answered 'connect' with a 'arenas_added' message, not "
                                  "'connected'"));

  e = error_of([&] {
    connection.request({{"proxyep", "start"}}, {}, "started", Deadline(5000ms), kPhase);
  });
  CHECK(e.phase() == kPhase);
  CHECK(contains(e.message(), "proxyepd at " + daemon.path() +
                                  " refused this client: rank 3 is already attached"));
  CHECK(daemon.finish() == "");
}

TEST_CASE("daemon connection: poll_failure takes notices, then a failure frame sticks") {
  TempDir dir;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    welcome(peer);
    peer.read();  // "next": the client has seen a quiet connection
    peer.send_together(
        {{{"proxyep", "peer_failure"}, {"rank", 3}}, {{"proxyep", "peer_failure"}, {"rank", 5}}});
    peer.read();  // "next": the client took the notices
    peer.send({{"proxyep", "failure"},
               {"phase", "proxy.fabric"},
               {"message", "writes to rank 2 failed"}});
    peer.hold();  // the failure comes from the frame, not from a close
  });
  DaemonConnection connection =
      DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase);
  std::vector<json> taken;
  auto take = [&](const json& message) {
    taken.push_back(message);
    return control::message_type(message) == "peer_failure";
  };
  CHECK(connection.poll_failure() == std::nullopt);
  CHECK(connection.poll_failure(take) == std::nullopt);
  CHECK(taken.empty());

  // Two notices that arrived together: one call hands both to take, and all is still well.
  connection.send({{"proxyep", "next"}}, {}, Deadline(5000ms), kPhase);
  REQUIRE(readable(connection));
  CHECK(connection.poll_failure(take) == std::nullopt);
  REQUIRE(taken.size() == 2);
  CHECK(taken[0]["rank"] == 3);
  CHECK(taken[1]["rank"] == 5);
  CHECK(connection.poll_failure(take) == std::nullopt);
  CHECK(taken.size() == 2);

  connection.send({{"proxyep", "next"}}, {}, Deadline(5000ms), kPhase);
  const auto failure = poll_until(connection, take, [] { return false; });
  REQUIRE(failure.has_value());
  CHECK(*failure == "proxyepd at " + daemon.path() + ": proxy.fabric: writes to rank 2 failed");
  CHECK(taken.size() == 3);  // offered to take first, which declined it
  // Sticky: every later call returns it, without reading or offering anything.
  CHECK(connection.poll_failure(take) == failure);
  CHECK(connection.poll_failure() == failure);
  CHECK(taken.size() == 3);
  CHECK(daemon.finish() == "");
}

TEST_CASE("daemon connection: a daemon that closes is a sticky failure saying so") {
  TempDir dir;
  FakeDaemon daemon(dir, [&](Peer& peer) {
    welcome(peer);
    peer.read();  // "next"
    peer.close();
  });
  DaemonConnection connection =
      DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase);
  CHECK(connection.poll_failure() == std::nullopt);
  connection.send({{"proxyep", "next"}}, {}, Deadline(5000ms), kPhase);
  const auto failure = poll_until(connection, {}, [] { return false; });
  REQUIRE(failure.has_value());
  CHECK(*failure == "proxyepd at " + daemon.path() + " closed the connection (the daemon exited?)");
  CHECK(connection.poll_failure() == failure);
  CHECK(daemon.finish() == "");
}

TEST_CASE("daemon connection: a daemon that never answers fails the wait at its deadline") {
  TempDir dir;
  SUBCASE("the welcome") {
    FakeDaemon daemon(dir, [&](Peer& peer) {
      peer.read();
      peer.hold();
    });
    const Deadline bound(200ms);
    const Error e =
        error_of([&] { DaemonConnection::open(daemon.path(), ClientKind::status, 200ms, kPhase); });
    CHECK(bound.expired());  // not before the deadline
    CHECK(e.phase() == kPhase);
    CHECK(contains(e.message(),
                   "proxyepd at " + daemon.path() + " did not send its welcome within 200 ms"));
    CHECK(daemon.finish() == "");
  }
  SUBCASE("a later receive") {
    FakeDaemon daemon(dir, [&](Peer& peer) {
      welcome(peer);
      peer.hold();
    });
    DaemonConnection connection =
        DaemonConnection::open(daemon.path(), ClientKind::attach, 5000ms, kPhase);
    const Deadline deadline(200ms);
    const Error e = error_of([&] { connection.receive("its pong", deadline, kPhase); });
    CHECK(deadline.expired());
    CHECK(e.phase() == kPhase);
    // The number is open()'s timeout, whatever the deadline of this wait (the header: "a
    // timeout message names this one").
    CHECK(contains(e.message(),
                   "proxyepd at " + daemon.path() + " did not send its pong within 5000 ms"));
    CHECK(daemon.finish() == "");
  }
}
