// Descriptors over a Unix stream socket (control/fd_passing.hpp), between the two ends of a
// socketpair in this process: memfds with known contents go out with the bytes, and the
// receiver's duplicates read the same pages, close-on-exec. Receives poll with a deadline first
// (the sockets are non-blocking), so a message that never comes fails instead of hanging.
#include "common/error.hpp"
#include "control/fd_passing.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using proxyep::Error;
using proxyep::control::kMaxPassedFds;
using proxyep::control::receive_with_fds;
using proxyep::control::send_with_fds;

namespace {

// Closes the descriptors it holds.
struct Fds {
  std::vector<int> fds;
  ~Fds() {
    for (int fd : fds)
      ::close(fd);
  }
};

struct SocketPair {
  int sender = -1;
  int receiver = -1;
  SocketPair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    sender = sv[0];
    receiver = sv[1];
  }
  ~SocketPair() {
    ::close(sender);
    ::close(receiver);
  }
  // Waits (at most 5 s) for something to read; false when nothing came.
  bool readable(int timeout_ms = 5000) const {
    pollfd fd{receiver, POLLIN, 0};
    return ::poll(&fd, 1, timeout_ms) == 1;
  }
};

// A memfd holding `text`, without close-on-exec: whatever flag a received duplicate has is the
// receiver's own doing.
int memfd_with(const std::string& text) {
  const int fd = ::memfd_create("proxyep-test-fd", 0);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  return fd;
}

std::string contents(int fd) {
  char buffer[256];
  const ssize_t n = ::pread(fd, buffer, sizeof buffer, 0);
  return n < 0 ? std::string("<pread failed>") : std::string(buffer, static_cast<size_t>(n));
}

bool close_on_exec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  return flags >= 0 && (flags & FD_CLOEXEC) != 0;
}

size_t open_descriptors() {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("fd passing: three memfds ride with the bytes; duplicates read the same, cloexec") {
  SocketPair pair;
  Fds sent{{memfd_with("arena"), memfd_with("staging ring"), memfd_with("relay ring, longer")}};
  const std::string bytes = "attach request";
  REQUIRE(send_with_fds(pair.sender, bytes, sent.fds) == static_cast<ssize_t>(bytes.size()));

  REQUIRE(pair.readable());
  char buffer[64];
  Fds received;
  const ssize_t n = receive_with_fds(pair.receiver, buffer, received.fds);
  REQUIRE(n == static_cast<ssize_t>(bytes.size()));
  CHECK(std::string(buffer, static_cast<size_t>(n)) == bytes);
  REQUIRE(received.fds.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const int fd = received.fds[i];
    CHECK(fd != sent.fds[i]);                      // a new descriptor in this process...
    CHECK(contents(fd) == contents(sent.fds[i]));  // ...on the same file, in the same order
    CHECK(close_on_exec(fd));
    CHECK_FALSE(close_on_exec(sent.fds[i]));
  }
  // The same pages: a write through the duplicate shows through the original.
  REQUIRE(::pwrite(received.fds[1], "STAGING", 7, 0) == 7);
  CHECK(contents(sent.fds[1]) == "STAGING ring");
}

TEST_CASE("fd passing: kMaxPassedFds in one message arrive; one more throws, sending nothing") {
  SocketPair pair;
  Fds sent;
  for (size_t i = 0; i < kMaxPassedFds; ++i)
    sent.fds.push_back(memfd_with("memfd " + std::to_string(i)));
  REQUIRE(send_with_fds(pair.sender, std::string("x"), sent.fds) == 1);
  REQUIRE(pair.readable());
  char buffer[8];
  Fds received;
  REQUIRE(receive_with_fds(pair.receiver, buffer, received.fds) == 1);
  REQUIRE(received.fds.size() == kMaxPassedFds);
  CHECK(contents(received.fds.back()) == "memfd " + std::to_string(kMaxPassedFds - 1));

  sent.fds.push_back(memfd_with("one too many"));
  try {
    (void)send_with_fds(pair.sender, std::string("y"), sent.fds);
    FAIL("send_with_fds took " << sent.fds.size() << " descriptors");
  } catch (const Error& e) {
    CHECK(e.phase() == "control.fd_passing");
    CHECK(e.message() == "17 descriptors in one message (at most 16)");
  }
  CHECK_FALSE(pair.readable(0));  // nothing went out
}

TEST_CASE("fd passing: a message without descriptors yields none") {
  SocketPair pair;
  const std::string bytes = "{\"proxyep\":\"start\"}";
  REQUIRE(send_with_fds(pair.sender, bytes, {}) == static_cast<ssize_t>(bytes.size()));
  REQUIRE(pair.readable());
  char buffer[64];
  Fds received;
  const ssize_t n = receive_with_fds(pair.receiver, buffer, received.fds);
  REQUIRE(n == static_cast<ssize_t>(bytes.size()));
  CHECK(std::string(buffer, static_cast<size_t>(n)) == bytes);
  CHECK(received.fds.empty());

  // The end of the stream: 0, still none.
  ::shutdown(pair.sender, SHUT_WR);
  REQUIRE(pair.readable());
  CHECK(receive_with_fds(pair.receiver, buffer, received.fds) == 0);
  CHECK(received.fds.empty());
}

TEST_CASE("fd passing: more descriptors than the receiver takes: EMSGSIZE, none leaked") {
  // A sender that does not go through send_with_fds (a stranger on the daemon's socket) can
  // attach more than kMaxPassedFds; the kernel installs what fits and flags MSG_CTRUNC.
  SocketPair pair;
  Fds source{{memfd_with("x")}};
  std::vector<int> many(kMaxPassedFds + 4, source.fds[0]);
  char byte = 'z';
  iovec io{&byte, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * many.size()));
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int) * many.size());
  std::memcpy(CMSG_DATA(header), many.data(), sizeof(int) * many.size());
  REQUIRE(::sendmsg(pair.sender, &message, MSG_NOSIGNAL) == 1);

  REQUIRE(pair.readable());
  const size_t before = open_descriptors();
  char buffer[8];
  Fds received;
  errno = 0;
  CHECK(receive_with_fds(pair.receiver, buffer, received.fds) == -1);
  CHECK(errno == EMSGSIZE);
  CHECK(received.fds.empty());
  CHECK(open_descriptors() == before);  // the ones that arrived were closed again
}
