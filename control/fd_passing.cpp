#include "control/fd_passing.hpp"

#include "common/error.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace proxyep::control {

ssize_t send_with_fds(int socket, std::span<const char> bytes, std::span<const int> fds) {
  require(fds.size() <= kMaxPassedFds, "control.fd_passing",
          "{} descriptors in one message (at most {})", fds.size(), kMaxPassedFds);
  iovec io{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  if (!fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(socket, &message, MSG_NOSIGNAL);
}

ssize_t receive_with_fds(int socket, std::span<char> buffer, std::vector<int>& fds) {
  iovec io{buffer.data(), buffer.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const size_t before = fds.size();
  const ssize_t n = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
       header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  if ((message.msg_flags & MSG_CTRUNC) != 0) {
    for (size_t i = before; i < fds.size(); ++i)
      ::close(fds[i]);
    fds.resize(before);
    errno = EMSGSIZE;
    return -1;
  }
  return n;
}

}  // namespace proxyep::control
