// The attach protocol, daemon side (attached_client.hpp).
#include "daemon/attached_client.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/daemon_handshake.hpp"
#include "control/fd_passing.hpp"
#include "daemon/daemon.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace proxyep::daemon {

namespace {

constexpr const char* kPhase = "daemon.attach";

std::vector<fabric::Bytes> hex_list(const nlohmann::json& message, const char* key) {
  const auto list = message.find(key);
  require(list != message.end() && list->is_array(), kPhase, "'{}' must be an array of hex strings",
          key);
  std::vector<fabric::Bytes> out;
  for (const auto& item : *list) {
    require(item.is_string(), kPhase, "'{}' must be an array of hex strings", key);
    out.push_back(control::hex_decode(item.get<std::string>(), key, kPhase));
  }
  return out;
}

int integer(const nlohmann::json& message, const char* key) {
  const auto value = message.find(key);
  require(value != message.end() && value->is_number_integer(), kPhase, "'{}' must be an integer",
          key);
  return value->get<int>();
}

}  // namespace

AttachedClient::AttachedClient(control::Socket socket, PeerCredentials peer, GroupCheck check_group)
    : socket_(std::move(socket)), peer_(peer), check_group_(std::move(check_group)) {}

AttachedClient::~AttachedClient() {
  drop_passed_fds();
}

void AttachedClient::drop_passed_fds() {
  for (int fd : passed_fds_)
    ::close(fd);
  passed_fds_.clear();
}

void AttachedClient::on_readable() {
  std::array<char, 16 * 1024> buffer;
  for (;;) {
    const ssize_t n = control::receive_with_fds(socket_.fd(), buffer, passed_fds_);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      log::info("proxyepd: {} (rank {}) disconnected{}", describe_peer(peer_),
                served_ ? served_->rank() : -1,
                n == 0 ? "" : fmt::format(" ({})", control::errno_text(errno)));
      close_connection();
      return;
    }
    decoder_.feed({buffer.data(), static_cast<size_t>(n)});
    for (;;) {
      nlohmann::json message;
      std::string problem;
      const auto result = decoder_.next(message, problem);
      if (result == control::FrameDecoder::Result::need_more) break;
      if (result == control::FrameDecoder::Result::error) {
        end("daemon.wire", problem);
        return;
      }
      try {
        handle(message);
      } catch (const Error& e) {
        log::warn("proxyepd: {} (rank {}): {}", describe_peer(peer_),
                  served_ ? served_->rank() : -1, e.what());
        send(control::error_message(e.what()));
        close_connection();
        return;
      }
      if (done()) return;
    }
  }
}

void AttachedClient::handle(const nlohmann::json& message) {
  const std::string type = control::message_type(message);
  if (type == "attach") {
    attach(message);
    return;
  }
  drop_passed_fds();  // only the attach request carries descriptors
  require(served_ != nullptr, kPhase, "'{}' before 'attach'", type);
  if (type == "connect") {
    const auto group = hex_list(message, "addresses");
    if (const std::string why = check_group_(*this, group); !why.empty()) fail(kPhase, "{}", why);
    served_->connect(group);
    send({{"proxyep", "connected"}});
  } else if (type == "arenas") {
    served_->add_arenas(hex_list(message, "descriptors"),
                        message.contains("landing_descriptors")
                            ? hex_list(message, "landing_descriptors")
                            : std::vector<fabric::Bytes>{});
    send({{"proxyep", "arenas_added"}});
  } else if (type == "start") {
    served_->start();
    log::info("proxyepd: {} serves rank {} of {}", describe_peer(peer_), served_->rank(),
              served_->ranks());
    send({{"proxyep", "started"}});
  } else if (type == "detach") {
    send({{"proxyep", "detached"}});
    close_connection();
  } else {
    fail(kPhase, "unknown request '{}'", type);
  }
}

void AttachedClient::attach(const nlohmann::json& message) {
  std::vector<int> fds = std::move(passed_fds_);
  passed_fds_.clear();
  if (served_ != nullptr) {
    for (int fd : fds)
      ::close(fd);
    fail(kPhase, "a second 'attach' on one connection");
  }
  AttachRequest request;
  request.rank = integer(message, "rank");
  request.ranks = integer(message, "ranks");
  request.tolerate_peer_failures = message.value("tolerate_peer_failures", false);
  request.landing_fabric = message.value("landing_fabric", std::string());
  request.device_ring = message.value("device_ring", false);
  served_ = std::make_shared<ServedRank>(request, std::move(fds));
  nlohmann::json opened{{"proxyep", "opened"},
                        {"addresses", control::hex_encode(served_->addresses())},
                        {"arena", control::hex_encode(served_->arena_descriptor())},
                        {"provider", served_->capabilities().provider}};
  if (auto landing = served_->landing_descriptor())
    opened["landing"] = control::hex_encode(*landing);
  send(opened);
}

void AttachedClient::tick() {
  if (!served_) return;
  if (!served_->started()) {
    served_->progress();
    return;
  }
  for (const auto& [rank, failure] : served_->new_peer_failures())
    send({{"proxyep", "peer_failure"},
          {"rank", rank},
          {"phase", failure.phase},
          {"message", failure.message}});
  if (auto failure = served_->failure()) end(failure->phase, failure->message);
}

void AttachedClient::end(std::string_view phase, std::string_view why) {
  if (done()) return;
  log::warn("proxyepd: stops serving {} (rank {}): {}: {}", describe_peer(peer_),
            served_ ? served_->rank() : -1, phase, why);
  send({{"proxyep", "failure"}, {"phase", phase}, {"message", why}});
  close_connection();
}

void AttachedClient::send(const nlohmann::json& message) {
  // Replies are small and the client reads each before its next request: the socket buffer
  // takes them whole. One that does not fit means the client stopped reading: it is dropped.
  const std::string frame = control::encode_frame(message);
  const ssize_t n = ::send(socket_.fd(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(frame.size())) {
    log::warn("proxyepd: {} does not read its replies ({}): dropping it", describe_peer(peer_),
              n < 0 ? control::errno_text(errno) : std::string("short write"));
    close_connection();
  }
}

void AttachedClient::close_connection() {
  // The proxy threads stop before the socket closes, so a client that sees the end of the
  // stream knows nothing of its memory is touched any more.
  served_.reset();
  drop_passed_fds();
  socket_.close();
}

}  // namespace proxyep::daemon
