// The attach protocol, daemon side (attached_client.hpp).
#include "daemon/attached_client.hpp"

#include "common/crypto.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "control/daemon_handshake.hpp"
#include "control/fd_passing.hpp"
#include "daemon/daemon.hpp"

#include <fmt/format.h>

#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>

#include <array>
#include <cerrno>
#include <utility>

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

// An HMAC-SHA256 in lower-case hex, as control::daemon_job_tag writes it.
bool is_job_tag(const std::string& tag) {
  return tag.size() == 2 * kMacBytes && std::all_of(tag.begin(), tag.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// {"handle": hex, "bytes": n, "fd": bool}: one piece of device memory the client offers.
AttachRequest::DeviceMemory device_memory_entry(const nlohmann::json& offer, const char* key) {
  const auto entry = offer.find(key);
  require(entry->is_object(), kPhase, "'device_memory.{}' must be an object", key);
  const auto handle = entry->find("handle");
  const auto bytes = entry->find("bytes");
  require(handle != entry->end() && handle->is_string() && bytes != entry->end() &&
              bytes->is_number_unsigned(),
          kPhase, "'device_memory.{}' needs a hex 'handle' and a byte count 'bytes'", key);
  AttachRequest::DeviceMemory memory;
  memory.handle = control::hex_decode(handle->get<std::string>(), key, kPhase);
  require(!memory.handle.empty() && memory.handle.size() <= gpu_side::device::kSharedHandleBytes,
          kPhase, "'device_memory.{}': a handle of {} bytes (1 to {})", key, memory.handle.size(),
          gpu_side::device::kSharedHandleBytes);
  memory.bytes = bytes->get<uint64_t>();
  require(memory.bytes > 0, kPhase, "'device_memory.{}': no bytes", key);
  memory.with_fd = entry->value("fd", false);
  return memory;
}

// {"device_memory": {"kind": "cuda", ...}}: the offer (nullptr: none) and its device's kind.
const nlohmann::json* device_offer(const nlohmann::json& message, std::string& kind) {
  const auto offer = message.find("device_memory");
  if (offer == message.end()) return nullptr;
  require(offer->is_object(), kPhase, "'device_memory' must be an object");
  const auto named = offer->find("kind");
  require(named != offer->end() && named->is_string() && !named->get<std::string>().empty(), kPhase,
          "'device_memory' needs its device's 'kind'");
  kind = named->get<std::string>();
  return &*offer;
}

// {"device_memory": {"kind": "cuda", "staging": {...}, "arena": {...}}}: both optional.
void read_device_memory(const nlohmann::json& message, AttachRequest& request) {
  const nlohmann::json* offer = device_offer(message, request.device_kind);
  if (offer == nullptr) return;
  if (offer->contains("staging")) request.device_staging = device_memory_entry(*offer, "staging");
  if (offer->contains("arena")) request.device_arena = device_memory_entry(*offer, "arena");
}

// Closes the descriptors a request took, whatever happens (the mappings keep the memory).
struct TakenFds {
  std::vector<int> fds;
  ~TakenFds() {
    for (int fd : fds)
      ::close(fd);
  }
  // The only descriptor of a request that needs exactly `expected` (0 or 1): -1 for none.
  int single(size_t expected, std::string_view type, std::string_view what) const {
    require(fds.size() == expected, kPhase, "'{}' carried {} file descriptors, {} expected ({})",
            type, fds.size(), expected, what);
    return fds.empty() ? -1 : fds.front();
  }
};

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
      } catch (const std::exception& e) {
        // proxyep::Error for what the checks refuse, and anything else a malformed request
        // raises (a JSON field of the wrong type): the client is refused, the daemon goes on.
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
  if (type == "step_memory" || type == "step_link") {
    steps(type, message);
    return;
  }
  drop_passed_fds();  // only the requests above carry descriptors
  require(served_ != nullptr, kPhase, "'{}' before 'attach'", type);
  if (type == "connect") {
    const auto group = hex_list(message, "addresses");
    if (const std::string why = check_group_(*this, group); !why.empty()) fail(kPhase, "{}", why);
    served_->connect(group);
    send({{"proxyep", "connected"}});
  } else if (type == "arenas") {
    const auto optional_list = [&message](const char* key) {
      return message.contains(key) ? hex_list(message, key) : std::vector<fabric::Bytes>{};
    };
    served_->add_arenas(hex_list(message, "descriptors"), optional_list("landing_descriptors"),
                        optional_list("device_arena_descriptors"));
    send({{"proxyep", "arenas_added"}});
  } else if (type == "open_connections") {
    require(message.contains("peers") && message["peers"].is_array(), kPhase,
            "'open_connections' needs the list of peers to probe");
    served_->open_connections(message["peers"].get<std::vector<int>>());
    send({{"proxyep", "connections_opening"}});
  } else if (type == "connections") {
    const bool open = served_->connections_open();
    nlohmann::json reply{{"proxyep", "connections"}, {"open", open}};
    if (!open) reply["waiting"] = served_->peers_awaiting_connection();
    send(reply);
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
  if (const auto tag = message.find("job_tag"); tag != message.end()) {
    require(tag->is_string() && is_job_tag(tag->get<std::string>()), kPhase,
            "'job_tag' must be 64 lower-case hex digits (control::daemon_job_tag)");
    request.job_tag = tag->get<std::string>();
  }
  request.tolerate_peer_failures = message.value("tolerate_peer_failures", false);
  request.landing_fabric = message.value("landing_fabric", std::string());
  request.device_ring = message.value("device_ring", false);
  request.step_ring = message.value("step_ring", false);
  read_device_memory(message, request);
  served_ = std::make_shared<ServedRank>(request, std::move(fds));
  nlohmann::json opened{{"proxyep", "opened"},
                        {"addresses", control::hex_encode(served_->addresses())},
                        {"arena", control::hex_encode(served_->arena_descriptor())},
                        {"provider", served_->capabilities().provider}};
  if (auto landing = served_->landing_descriptor())
    opened["landing"] = control::hex_encode(*landing);
  if (request.device_staging) opened["device_staging"] = served_->device_staging_registered();
  if (auto device_arena = served_->device_arena_descriptor())
    opened["device_arena"] = control::hex_encode(*device_arena);
  if (!served_->device_memory_note().empty())
    opened["device_memory_note"] = served_->device_memory_note();
  send(opened);
}

void AttachedClient::steps(const std::string& type, const nlohmann::json& message) {
  const TakenFds taken{std::exchange(passed_fds_, {})};
  require(running(), kPhase, "'{}' before 'start'", type);
  if (type == "step_memory") {
    const auto bytes = message.find("bytes");
    require(bytes != message.end() && bytes->is_number_unsigned(), kPhase,
            "'step_memory' needs a byte count 'bytes'");
    std::string kind;
    std::optional<AttachRequest::DeviceMemory> device;
    if (const nlohmann::json* offer = device_offer(message, kind)) {
      require(offer->contains("step"), kPhase, "'step_memory.device_memory' needs its 'step'");
      device = device_memory_entry(*offer, "step");
    }
    const int fd = taken.single(device && !device->with_fd ? 0 : 1, type,
                                device ? "the device memory's" : "the step memory's memfd");
    std::string note;
    const auto region = served_->add_step_memory(bytes->get<uint64_t>(), device, kind, fd, note);
    nlohmann::json registered{{"proxyep", "step_memory_registered"}};
    if (region)
      registered["region"] = control::hex_encode(*region);
    else
      registered["note"] = note;
    send(registered);
    return;
  }
  const auto words = message.find("words");
  require(words != message.end() && words->is_number_unsigned(), kPhase,
          "'step_link' needs a word count 'words'");
  const int fd = taken.single(1, type, "the signal words' memfd");
  served_->link_steps(hex_list(message, "descriptors"), fd, words->get<uint32_t>(),
                      message.value("keep_polling", true));
  log::info("proxyepd: {} (rank {}): captured steps linked ({} signal words; step memory in {})",
            describe_peer(peer_), served_->rank(), words->get<uint32_t>(),
            served_->step_memory_on_device() ? "device memory" : "host memory");
  send({{"proxyep", "step_linked"}});
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
