// StarServer, part 1: listening and admitting one connection per rank (the rendezvous).
#include "common/error.hpp"
#include "common/log.hpp"
#include "control/star_server.hpp"

#include <cerrno>

namespace proxyep::control {
namespace {

const std::string kPhase = "bootstrap.rendezvous";
// EADDRINUSE is retried this long: a port just released (or picked by a launcher a moment ago)
// can be briefly taken by a connection attempt; a port held for real fails soon and clearly.
constexpr std::chrono::milliseconds kBindRetry{1000};
constexpr std::chrono::milliseconds kBindBackoff{20};

}  // namespace

StarServer::StarServer(EndpointContext context) : context_(std::move(context)) {
  peers_.resize(static_cast<size_t>(context_.env.world_size));
  identities_.resize(peers_.size());
  try {
    rendezvous();
  } catch (const std::exception& e) {
    abort(e.what());  // the ranks that did join learn the names of those that did not
    throw;
  }
}

StarServer::~StarServer() = default;

std::string StarServer::address() const {
  const auto& host =
      context_.listen_address.empty() ? context_.env.master_addr : context_.listen_address;
  return fmt::format("{}:{}", host, context_.env.master_port);
}

void StarServer::listen(const Deadline& deadline) {
  const auto& host =
      context_.listen_address.empty() ? context_.env.master_addr : context_.listen_address;
  Deadline bind_deadline(std::min(kBindRetry, deadline.remaining()));
  std::string error;
  int code = 0;
  while (true) {
    listener_ = listen_tcp(host, context_.env.master_port, context_.env.world_size, error, code);
    if (listener_.valid()) return;
    if (code != EADDRINUSE || bind_deadline.expired()) break;
    sleep_slices(kBindBackoff, bind_deadline, progress(), kPhase);
  }
  fail(kPhase, "rank 0 cannot serve the rendezvous at {} ({}:MASTER_PORT): {}", address(),
       context_.listen_address.empty() ? "MASTER_ADDR" : "bootstrap.interface", error);
}

void StarServer::rendezvous() {
  Deadline deadline(context_.timeout);
  listen(deadline);
  const int world = context_.env.world_size;
  log::debug("bootstrap: rank 0 serving the rendezvous of {} ranks at {}", world, address());
  auto joined = [&] {
    int count = 0;
    for (const auto& peer : peers_)
      count += peer ? 1 : 0;
    return count;
  };
  while (joined() < world - 1) {
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int rank = 1; rank < world; ++rank)
        if (!peers_[rank]) missing.push_back(rank);
      fail(kPhase, "{} did not arrive within {} ms (rank 0 served the rendezvous at {})",
           ranks_text(missing), context_.timeout.count(), address());
    }
    pump(deadline, kPhase);
    accept_waiting();
    for (auto& connection : pending_)
      if (screen_pending(connection)) connection.reset();
    std::erase(pending_, nullptr);
    check_joined_peers();
  }
  send_to_all(wire::Header{.kind = wire::Kind::welcome}, {}, kPhase);
  // Strays still waiting, and strays after the rendezvous, get a closed connection (or
  // "connection refused"), not a hang.
  pending_.clear();
  listener_.close();
  log::debug("bootstrap: all {} ranks joined", world);
}

void StarServer::accept_waiting() {
  while (true) {
    Socket socket = accept_one(listener_);
    if (!socket.valid()) return;
    std::string peer = peer_name(socket.fd());
    pending_.push_back(std::make_unique<FramedConnection>(std::move(socket), std::move(peer)));
  }
}

bool StarServer::screen_pending(Connection& connection) {
  try {
    auto hello = connection->pop_frame();
    if (hello) {
      admit(connection, *hello);
      return true;
    }
  } catch (const wire::BadFrame& e) {
    log::warn("bootstrap: ignoring a connection from {} that is not a ProxyEP rank: {}",
              connection->peer(), e.what());
    return true;
  }
  if (connection->closed())
    log::debug("bootstrap: a connection from {} closed before its handshake", connection->peer());
  return connection->closed();
}

void StarServer::admit(Connection& connection, const wire::Frame& hello) {
  const auto& header = hello.header;
  if (header.kind != wire::Kind::hello)
    throw wire::BadFrame(
        fmt::format("expected a handshake, got '{}'", wire::to_string(header.kind)));
  const int world = context_.env.world_size;
  const auto rank = header.rank;
  std::string who = fmt::format("{}, from {}", wire::as_text(hello.payload), connection->peer());
  // A mismatch means a broken launch (a stale process, a wrong RANK or WORLD_SIZE): fail the
  // whole world now rather than time out later; abort() tells this connection too.
  require(header.version == wire::kVersion, kPhase,
          "a rank ({}) speaks bootstrap protocol version {} but rank 0 speaks version {}: every "
          "rank must run the same ProxyEP build",
          who, header.version, wire::kVersion);
  require(header.aux == static_cast<uint32_t>(world), kPhase,
          "rank {} ({}) was started with WORLD_SIZE={} but rank 0 has WORLD_SIZE={}", rank, who,
          header.aux, world);
  require(rank != 0, kPhase, "two processes claim rank 0: this one and another ({})", who);
  require(rank < static_cast<uint32_t>(world), kPhase,
          "a process ({}) claims RANK={}, outside 0..{} for WORLD_SIZE={}", who, rank, world - 1,
          world);
  require(!peers_[rank], kPhase,
          "two processes claim rank {}: first {}, then {} (was RANK given twice?)", rank,
          identities_[rank], who);
  identities_[rank] = who;
  peers_[rank] = std::move(connection);
  log::debug("bootstrap: rank {} joined ({})", rank, who);
}

void StarServer::check_joined_peers() {
  for (size_t rank = 1; rank < peers_.size(); ++rank) {
    auto& peer = peers_[rank];
    if (!peer) continue;
    while (auto frame = pop_checked(static_cast<int>(rank), kPhase)) {
      require(frame->header.kind != wire::Kind::abort, kPhase, "rank {} failed: {}", rank,
              wire::as_text(frame->payload));
      fail(kPhase, "rank {} sent an unexpected '{}' frame during the rendezvous", rank,
           wire::to_string(frame->header.kind));
    }
    require(!peer->closed(), kPhase,
            "rank {} ({}) closed its bootstrap connection during the "
            "rendezvous ({})",
            rank, identities_[rank], peer->close_reason());
  }
}

}  // namespace proxyep::control
