// File descriptors over a Unix stream socket (SCM_RIGHTS): how a node daemon's client hands its
// rings and buffers (memfds) and its doorbell (an eventfd) to the daemon. The kernel installs a
// duplicate of each descriptor in the receiver, which then maps the same pages.
//
// Descriptors ride on the first byte of a message; a receiver that reads the stream in chunks
// collects them with whichever recvmsg() got that byte. At most kMaxPassedFds per message.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <vector>

namespace proxyep::control {

inline constexpr size_t kMaxPassedFds = 16;

// sendmsg() of `bytes` with `fds` attached (MSG_NOSIGNAL). Returns the bytes sent, or -1 with
// errno set. Throws proxyep::Error("control.fd_passing") for more than kMaxPassedFds.
ssize_t send_with_fds(int socket, std::span<const char> bytes, std::span<const int> fds);

// recvmsg() into `buffer`; descriptors that came with the bytes are appended to `fds`
// (close-on-exec; the caller owns them). Returns the bytes read (0: end of stream) or -1 with
// errno set. A message whose descriptors did not fit (MSG_CTRUNC) fails with EMSGSIZE after
// closing those that arrived.
ssize_t receive_with_fds(int socket, std::span<char> buffer, std::vector<int>& fds);

}  // namespace proxyep::control
