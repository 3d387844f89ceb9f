// Who may talk to proxyepd: the kernel's word on the peer (SO_PEERCRED, read on accept, before
// a byte of the peer's is parsed) checked against daemon.allow_uids and daemon.allow_gids.
// File permissions on the socket and its directory are the first gate; this is the second,
// and the one that names who was refused and why (in the daemon's log and in the error frame
// the peer gets).
//
// A peer is served when its uid is allowed, or its primary gid is. An empty uid list means the
// daemon's own uid and root (0); an empty gid list allows no group. Ids are numeric: the daemon
// resolves no names (a container's /etc/passwd is not the host's).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::daemon {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of the process at the other end of connected Unix socket `fd`, or nullopt
// with `error` set (errno text) when the kernel does not give them.
std::optional<PeerCredentials> peer_credentials(int fd, std::string& error);

// "0,1000, 1001" -> {0, 1000, 1001}; empty entries are skipped. Throws proxyep::Error
// ("daemon.access") naming `what` (the parameter) for anything else than ids separated by
// commas, or an id beyond 32 bits.
std::vector<uint32_t> parse_id_list(std::string_view text, std::string_view what);

class AccessPolicy {
 public:
  // From the parameters' text (daemon.allow_uids, daemon.allow_gids); `own_uid` fills an empty
  // uid list. Throws as parse_id_list.
  static AccessPolicy from_lists(std::string_view uids, std::string_view gids, uid_t own_uid);

  // "" when `peer` may use the daemon; otherwise why not, naming its ids and the allowed ones.
  std::string refusal(const PeerCredentials& peer) const;
  // "uids 0, 1000; gids none", for the log and messages.
  std::string describe() const;

  const std::vector<uint32_t>& uids() const { return uids_; }
  const std::vector<uint32_t>& gids() const { return gids_; }

 private:
  std::vector<uint32_t> uids_;
  std::vector<uint32_t> gids_;
};

}  // namespace proxyep::daemon
