#include "daemon/access_policy.hpp"

#include "common/error.hpp"
#include "control/tcp_socket.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace proxyep::daemon {
namespace {

std::string id_list_text(const std::vector<uint32_t>& ids) {
  return ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(ids, ", "));
}

bool listed(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::optional<PeerCredentials> peer_credentials(int fd, std::string& error) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    error = control::errno_text(errno);
    return std::nullopt;
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

std::vector<uint32_t> parse_id_list(std::string_view text, std::string_view what) {
  std::vector<uint32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ')
      item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ')
      item.remove_suffix(1);
    if (!item.empty()) {
      require(item.find_first_not_of("0123456789") == std::string_view::npos, "daemon.access",
              "{} = '{}': '{}' is not a numeric id (ids separated by commas)", what, text, item);
      // More than 10 digits is beyond 32 bits whatever they are (and could overflow stoull).
      require(item.size() <= 10 && std::stoull(std::string(item)) <= UINT32_MAX, "daemon.access",
              "{} = '{}': id {} is beyond 32 bits", what, text, item);
      const uint64_t id = std::stoull(std::string(item));
      if (!listed(ids, static_cast<uint32_t>(id))) ids.push_back(static_cast<uint32_t>(id));
    }
    start = comma + 1;
  }
  return ids;
}

AccessPolicy AccessPolicy::from_lists(std::string_view uids, std::string_view gids, uid_t own_uid) {
  AccessPolicy policy;
  policy.uids_ = parse_id_list(uids, "daemon.allow_uids");
  if (policy.uids_.empty()) {
    policy.uids_.push_back(0);
    if (own_uid != 0) policy.uids_.push_back(own_uid);
  }
  policy.gids_ = parse_id_list(gids, "daemon.allow_gids");
  return policy;
}

std::string AccessPolicy::refusal(const PeerCredentials& peer) const {
  if (listed(uids_, peer.uid) || listed(gids_, peer.gid)) return "";
  return fmt::format(
      "uid {} (gid {}) may not use this proxyepd: it serves uids {} and gids {} "
      "(daemon.allow_uids, daemon.allow_gids)",
      peer.uid, peer.gid, id_list_text(uids_), id_list_text(gids_));
}

std::string AccessPolicy::describe() const {
  return fmt::format("uids {}; gids {}", id_list_text(uids_), id_list_text(gids_));
}

}  // namespace proxyep::daemon
