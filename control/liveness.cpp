// The liveness star (liveness.hpp): setup through the bootstrap, then one monitor thread per rank.
#include "control/liveness.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/wire.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace proxyep::control {

namespace {

constexpr const char* kPhase = "bootstrap.liveness";
constexpr uint32_t kMagic = 0x564c5850;  // "PXLV" read as little-endian bytes
constexpr uint16_t kVersion = 1;
constexpr size_t kTokenBytes = 16;
constexpr uint32_t kMaxMessage = 4096;  // a reason text and change; more is not this protocol
// A host that stops answering (no FIN ever comes) is found by keepalive probes: after 10 s of
// silence, 3 probes 2 s apart.
constexpr int kKeepIdleSeconds = 10, kKeepIntervalSeconds = 2, kKeepProbes = 3;
constexpr std::chrono::milliseconds kSendTimeout{200};

enum class Kind : uint16_t { hello = 1, bye = 2, failed = 3 };

using Token = std::array<uint8_t, kTokenBytes>;

struct Message {
  Kind kind = Kind::bye;
  int rank = -1;
  Token token{};       // hello
  std::string reason;  // failed
};

Message message(Kind kind, int rank, std::string reason = {}) {
  Message m;
  m.kind = kind;
  m.rank = rank;
  m.reason = std::move(reason);
  return m;
}

std::vector<uint8_t> encode(const Message& m) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(0);  // the length, filled in below
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(m.kind));
  w.u32(static_cast<uint32_t>(m.rank));
  if (m.kind == Kind::hello) w.bytes(m.token);
  if (m.kind == Kind::failed) {
    const size_t n = std::min<size_t>(m.reason.size(), kMaxMessage / 2);
    w.u16(static_cast<uint16_t>(n));
    w.bytes({reinterpret_cast<const uint8_t*>(m.reason.data()), n});
  }
  const auto length = static_cast<uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i)
    out[static_cast<size_t>(i)] = static_cast<uint8_t>(length >> (8 * i));
  return out;
}

Message decode(std::span<const uint8_t> payload) {
  ByteReader r(payload, kPhase);
  require(r.u32("magic") == kMagic && r.u16("version") == kVersion, kPhase,
          "not a liveness message of this ProxyEP version");
  Message m;
  m.kind = static_cast<Kind>(r.u16("kind"));
  m.rank = static_cast<int>(r.u32("rank"));
  if (m.kind == Kind::hello) {
    auto token = r.bytes(kTokenBytes, "token");
    std::copy(token.begin(), token.end(), m.token.begin());
  } else if (m.kind == Kind::failed) {
    auto text = r.bytes(r.u16("reason length"), "reason");
    m.reason.assign(text.begin(), text.end());
  } else {
    require(m.kind == Kind::bye, kPhase, "unknown liveness message kind {}",
            static_cast<int>(m.kind));
  }
  r.expect_end("liveness message");
  return m;
}

// The next whole message in `inbox`, removed from it; nullopt while it is incomplete.
std::optional<Message> pop(std::vector<uint8_t>& inbox) {
  if (inbox.size() < 4) return std::nullopt;
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i)
    length |= uint32_t{inbox[static_cast<size_t>(i)]} << (8 * i);
  require(length <= kMaxMessage, kPhase, "a liveness message of {} bytes is not this protocol",
          length);
  if (inbox.size() < 4 + length) return std::nullopt;
  Message m = decode(std::span<const uint8_t>(inbox).subspan(4, length));
  inbox.erase(inbox.begin(), inbox.begin() + 4 + length);
  return m;
}

// Best effort, bounded: the messages are tiny and the socket buffer is empty.
bool send_message(const Socket& socket, const Message& m) {
  const auto bytes = encode(m);
  const Deadline deadline(kSendTimeout);
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(socket.fd(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (deadline.expired()) return false;
    pollfd pfd{socket.fd(), POLLOUT, 0};
    (void)::poll(&pfd, 1, 10);
  }
  return true;
}

void keep_alive(const Socket& socket) {
  int on = 1;
  (void)::setsockopt(socket.fd(), SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  (void)::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPIDLE, &kKeepIdleSeconds,
                     sizeof kKeepIdleSeconds);
  (void)::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPINTVL, &kKeepIntervalSeconds,
                     sizeof kKeepIntervalSeconds);
  (void)::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPCNT, &kKeepProbes, sizeof kKeepProbes);
}

Token random_token() {
  Token token{};
  size_t got = 0;
  while (got < token.size()) {
    ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, kPhase, "getrandom failed: {}", errno_text(errno));
    got += static_cast<size_t>(n);
  }
  return token;
}

// Rank 0: accepts one connection per other rank, each proving itself with the token. Strangers
// (wrong token, a rank claimed twice, garbage) are logged and dropped.
std::vector<Liveness::Peer> gather_peers(const Socket& listener, const Token& token, int world,
                                         std::chrono::milliseconds timeout) {
  std::vector<Liveness::Peer> joined;
  std::vector<Liveness::Peer> pending;
  std::vector<bool> seen(static_cast<size_t>(world), false);
  const Deadline deadline(timeout);
  while (static_cast<int>(joined.size()) < world - 1) {
    require(!deadline.expired(), kPhase, "{} of {} ranks connected within {} ms", joined.size(),
            world - 1, timeout.count());
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (const auto& p : pending)
      fds.push_back({p.socket.fd(), POLLIN, 0});
    poll_slice(fds, deadline, {}, kPhase);
    for (Socket s = accept_one(listener); s.valid(); s = accept_one(listener))
      pending.emplace_back(-1, std::move(s));
    for (auto it = pending.begin(); it != pending.end();) {
      uint8_t buffer[256];
      ssize_t n = ::recv(it->socket.fd(), buffer, sizeof buffer, 0);
      if (n > 0) it->inbox.insert(it->inbox.end(), buffer, buffer + n);
      std::optional<Message> hello;
      std::string refusal;
      try {
        hello = pop(it->inbox);
      } catch (const Error& e) {
        refusal = e.what();
      }
      if (hello && (hello->kind != Kind::hello || hello->token != token || hello->rank <= 0 ||
                    hello->rank >= world || seen[static_cast<size_t>(hello->rank)]))
        refusal = "a wrong token or rank";
      if (refusal.empty() && n == 0) refusal = "it closed before its hello";
      if (refusal.empty() && n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        refusal = errno_text(errno);
      if (!refusal.empty()) {
        log::warn("bootstrap: dropped a liveness connection from {}: {}",
                  peer_name(it->socket.fd()), refusal);
        it = pending.erase(it);
        continue;
      }
      if (!hello) {
        ++it;
        continue;
      }
      seen[static_cast<size_t>(hello->rank)] = true;
      it->rank = hello->rank;
      joined.push_back(std::move(*it));
      it = pending.erase(it);
    }
  }
  return joined;
}

Socket connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  std::string error;
  while (!deadline.expired()) {
    if (auto s = connect_once(host, port, deadline, {}, error)) return std::move(*s);
    sleep_slices(std::chrono::milliseconds(20), deadline, {}, kPhase);
  }
  fail(kPhase, "cannot reach rank 0's liveness port {}:{} within {} ms: {}", host, port,
       timeout.count(), error);
}

}  // namespace

std::unique_ptr<Liveness> Liveness::start(Bootstrap& bootstrap, const std::string& bind_host,
                                          const std::string& master_addr,
                                          std::chrono::milliseconds timeout) {
  const int world = bootstrap.world_size();
  std::vector<Peer> peers;
  if (bootstrap.rank() == 0) {
    std::string error;
    int code = 0;
    Socket listener = listen_tcp(bind_host, 0, world, error, code);
    require(listener.valid(), kPhase, "cannot listen on {}: {}", bind_host, error);
    const Token token = random_token();
    std::vector<uint8_t> invitation;
    ByteWriter w(invitation);
    w.u16(static_cast<uint16_t>(local_port(listener.fd())));
    w.bytes(token);
    (void)bootstrap.broadcast(invitation, 0, "liveness(port)");
    peers = gather_peers(listener, token, world, timeout);
  } else {
    const auto invitation = bootstrap.broadcast({}, 0, "liveness(port)");
    ByteReader r(invitation, kPhase);
    const int port = r.u16("port");
    Message hello = message(Kind::hello, bootstrap.rank());
    auto token = r.bytes(kTokenBytes, "token");
    std::copy(token.begin(), token.end(), hello.token.begin());
    Peer zero(0, connect_with_retry(master_addr, port, timeout));
    require(send_message(zero.socket, hello), kPhase, "cannot send the hello to rank 0");
    peers.push_back(std::move(zero));
  }
  for (const Peer& p : peers)
    keep_alive(p.socket);
  bootstrap.barrier("liveness(ready)");
  return std::unique_ptr<Liveness>(new Liveness(bootstrap.rank(), std::move(peers)));
}

Liveness::Liveness(int rank, std::vector<Peer> peers)
    : rank_(rank), peers_(std::move(peers)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  require(wake_.valid(), kPhase, "eventfd failed: {}", errno_text(errno));
  thread_ = std::thread([this] { monitor(); });
}

Liveness::~Liveness() {
  const uint64_t one = 1;
  (void)!::write(wake_.fd(), &one, sizeof one);
  thread_.join();
  for (const Peer& p : peers_)
    if (p.socket.valid()) (void)send_message(p.socket, message(Kind::bye, rank_));
}

std::optional<PeerFailure> Liveness::failure() const {
  if (!failed_.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(mutex_);
  return failure_;
}

bool Liveness::departed(int rank) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  std::lock_guard lock(mutex_);
  return std::find(departed_.begin(), departed_.end(), rank) != departed_.end();
}

void Liveness::record(int rank, const std::string& reason) {
  std::lock_guard lock(mutex_);
  const bool known =
      rank >= 0 && std::find(departed_.begin(), departed_.end(), rank) != departed_.end();
  if (rank >= 0 && !known) departed_.push_back(rank);
  if (!known && (rank >= 0 || !failure_))
    log::warn("bootstrap: rank {} left the job: {}", rank, reason);
  if (failure_) return;  // the first is the cause of what fails; failure() keeps it
  failure_ = PeerFailure{rank, reason};
  failed_.store(true, std::memory_order_release);
}

void Liveness::monitor() {
  std::vector<pollfd> fds;
  while (true) {
    fds.assign(1, {wake_.fd(), POLLIN, 0});
    for (const Peer& p : peers_)
      if (p.socket.valid()) fds.push_back({p.socket.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) {
      record(-1, fmt::format("the liveness monitor failed: {}", errno_text(errno)));
      return;
    }
    if (fds[0].revents != 0) return;  // the destructor
    for (Peer& p : peers_)
      if (p.socket.valid() && !drain(p)) p.socket.close();
  }
}

bool Liveness::drain(Peer& peer) {
  uint8_t buffer[512];
  std::optional<std::string> ended;  // why the connection ended, if it did
  while (true) {
    ssize_t n = ::recv(peer.socket.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) {
      peer.inbox.insert(peer.inbox.end(), buffer, buffer + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    ended = n == 0 ? "its connection closed without a goodbye: the process died, or its host is "
                     "unreachable"
                   : fmt::format("its connection failed ({})", errno_text(errno));
    break;
  }
  // Messages first: a peer that leaves cleanly sends its goodbye and closes at once, so the
  // goodbye and the end of the stream often arrive in one drain.
  try {
    while (auto m = pop(peer.inbox)) {
      if (m->kind == Kind::bye) peer.said_bye = true;
      if (m->kind == Kind::failed && rank_ != 0) record(m->rank, m->reason);
    }
  } catch (const Error& e) {
    closed(peer, fmt::format("it sent garbage ({})", e.what()));
    return false;
  }
  if (!ended) return true;
  closed(peer, *ended);
  return false;
}

void Liveness::closed(Peer& peer, const std::string& why) {
  if (peer.said_bye) return;
  record(peer.rank, why);
  if (rank_ != 0) return;
  // Rank 0 relays it: the others have no connection to that rank.
  for (const Peer& other : peers_)
    if (&other != &peer && other.socket.valid())
      (void)send_message(other.socket, message(Kind::failed, peer.rank, why));
}

}  // namespace proxyep::control
