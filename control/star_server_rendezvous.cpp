// StarServer, part 1: listening, challenging and admitting one proven member per rank (the
// rendezvous; control/rendezvous_auth.hpp says what is proven and how).
#include "common/descriptor_limit.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "control/rendezvous_auth.hpp"
#include "control/star_server.hpp"

#include <algorithm>
#include <cerrno>

namespace proxyep::control {
namespace {

const std::string kPhase = "bootstrap.rendezvous";
// EADDRINUSE is retried this long: a port just released (or picked by a launcher a moment ago)
// can be briefly taken by a connection attempt; a port held for real fails soon and clearly.
constexpr std::chrono::milliseconds kBindRetry{1000};
constexpr std::chrono::milliseconds kBindBackoff{20};
// Connections waiting for their handshake at once: at least this many, and at least twice the
// world (every rank of a job may connect in one burst, since launchers start them together, and
// their hellos are screened only after the burst is accepted: a cap below the world dropped the
// job's own ranks at 128). Only a flood of strangers fills it; it keeps rank 0's descriptors
// bounded by the job's size.
constexpr size_t kMinPendingCap = 64;
// Refused connections whose abort frame is still being delivered: strangers only.
constexpr size_t kMaxClosing = 64;
// Refusals quoted when ranks are missing at the deadline.
constexpr size_t kRefusalsKept = 3;
// Refusals and drops logged as warnings per rendezvous; a flood goes on at debug level.
constexpr size_t kWarningsLogged = 16;

// A connection rank 0 will not admit, and why (said to the connection and logged).
struct Refused {
  std::string reason;
};

}  // namespace

StarServer::StarServer(EndpointContext context) : context_(std::move(context)) {
  peers_.resize(static_cast<size_t>(context_.env.world_size));
  identities_.resize(peers_.size());
  welcomes_.resize(peers_.size());
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
  const int world = context_.env.world_size;
  // A connection per rank, up to twice the world awaiting their handshake, the refused ones
  // closing, and what the process holds besides: at 1024 ranks, past the usual soft limit.
  reserve_descriptors(3 * static_cast<uint64_t>(world) + kMaxClosing + 256, kPhase);
  listen(deadline);
  log::debug("bootstrap: rank 0 serving the rendezvous of {} ranks of job {} at {} ({})", world,
             job_label(context_.job_id), address(),
             context_.secret ? "members prove the job's secret" : "no job secret");
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
      std::string refused;
      if (refused_ > 0) {
        refused = fmt::format("; it refused {} connection{}, the latest: ", refused_,
                              refused_ == 1 ? "" : "s");
        for (size_t i = 0; i < refusals_.size(); ++i)
          refused += (i == 0 ? "" : "; ") + refusals_[i];
      }
      fail(kPhase, "{} did not arrive within {} ms (rank 0 served the rendezvous at {}{})",
           ranks_text(missing), context_.timeout.count(), address(), refused);
    }
    pump(deadline, kPhase);
    accept_waiting();
    for (auto& pending : pending_)
      if (screen_pending(pending) && pending.connection) pending.connection.reset();
    std::erase_if(pending_, [](const Pending& pending) { return !pending.connection; });
    tend_closing();
    check_joined_peers();
  }
  for (int rank = 1; rank < world; ++rank)
    peers_[rank]->queue(wire::Header{.kind = wire::Kind::welcome}, welcomes_[rank]);
  flush_to_all(wire::Kind::welcome, kPhase);
  // Strays still waiting, and strays after the rendezvous, get a closed connection (or
  // "connection refused"), not a hang.
  pending_.clear();
  closing_.clear();
  listener_.close();
  log::debug("bootstrap: all {} ranks joined", world);
}

void StarServer::accept_waiting() {
  const size_t cap = std::max(kMinPendingCap, 2 * static_cast<size_t>(context_.env.world_size));
  while (true) {
    Socket socket = accept_one(listener_);
    if (!socket.valid()) return;
    if (pending_.size() >= cap) {
      note_stranger(
          fmt::format("{} connections are waiting for their handshake; dropped the "
                      "oldest (from {})",
                      pending_.size(), pending_.front().connection->peer()));
      pending_.erase(pending_.begin());
    }
    std::string peer = peer_name(socket.fd());
    Pending pending;
    pending.connection = std::make_unique<FramedConnection>(std::move(socket), std::move(peer));
    pending.connection->limit_payload(wire::kMaxHandshakeBytes);
    pending.nonce = fresh_nonce();
    wire::Challenge challenge{static_cast<bool>(context_.secret), pending.nonce, context_.job_id};
    pending.connection->queue(wire::Header{.kind = wire::Kind::challenge,
                                           .aux = static_cast<uint32_t>(context_.env.world_size)},
                              wire::encode_challenge(challenge));
    pending.connection->flush();
    pending_.push_back(std::move(pending));
  }
}

bool StarServer::screen_pending(Pending& pending) {
  auto& connection = *pending.connection;
  try {
    auto frame = connection.pop_frame();
    if (frame) {
      admit(pending, *frame);
      return true;
    }
  } catch (const wire::BadFrame& e) {
    refuse(pending, "", fmt::format("not a ProxyEP rank: {}", e.what()));
    return true;
  }
  if (connection.closed())
    log::debug("bootstrap: a connection from {} closed before its handshake", connection.peer());
  return connection.closed();
}

wire::Bytes StarServer::authenticate(const Pending& pending, const wire::Frame& frame,
                                     wire::Hello& hello, std::string& claim) const {
  const auto& header = frame.header;
  const auto rank = header.rank;
  if (header.kind == wire::Kind::abort)
    throw Refused{fmt::format("it gave up before its handshake: {}",
                              printable(wire::as_text(frame.payload), 300))};
  if (header.kind != wire::Kind::hello)
    throw Refused{fmt::format("not a ProxyEP rank: expected a hello, got '{}'",
                              wire::to_string(header.kind))};
  claim = fmt::format("claiming rank {}", rank);
  if (header.version != wire::kVersion)
    throw Refused{fmt::format(
        "it speaks bootstrap protocol version {}, rank 0 version {}: another ProxyEP build, or "
        "not a rank of this job",
        header.version, wire::kVersion)};
  try {
    hello = wire::decode_hello(frame.payload);
  } catch (const wire::BadFrame& e) {
    throw Refused{fmt::format("malformed hello: {}", e.what())};
  }
  claim = fmt::format("claiming rank {}, {}", rank, printable(hello.identity));
  if (hello.job_id != context_.job_id)
    throw Refused{
        fmt::format("it belongs to job {}, rank 0 to job {}: two jobs share this port, or "
                    "the job's ranks were given different job ids",
                    job_label(hello.job_id), job_label(context_.job_id))};
  HandshakeClaims claims{rank,           header.aux,   hello.job_id,
                         &pending.nonce, &hello.nonce, hello.identity};
  if (!context_.secret) {
    if (hello.mac)
      throw Refused{"it has a job secret and rank 0 has none: give every rank the same secret"};
    return wire::encode_welcome({});
  }
  if (!hello.mac)
    throw Refused{
        "it offers no proof of the job's secret, and rank 0 requires one (give every "
        "rank the same bootstrap.secret_file)"};
  if (!constant_time_equal(*hello.mac, hello_mac(*context_.secret, claims)))
    throw Refused{
        "its proof of the job's secret does not verify: the ranks were given different "
        "secrets, or the handshake is forged or replayed"};
  return wire::encode_welcome({welcome_mac(*context_.secret, claims)});
}

void StarServer::admit(Pending& pending, const wire::Frame& frame) {
  const auto& header = frame.header;
  const int world = context_.env.world_size;
  const auto rank = header.rank;
  wire::Hello hello;
  wire::Bytes welcome;  // this rank's welcome: rank 0's proof, bound to its claims and nonce
  std::string claim;    // what the connection claims, for the log
  try {
    welcome = authenticate(pending, frame, hello, claim);
  } catch (const Refused& refused) {
    refuse(pending, claim, refused.reason);
    return;
  }
  // A proven member of this job: a conflict now means a broken launch (a stale process, a wrong
  // RANK or WORLD_SIZE), so fail the whole world rather than time out later; abort() tells this
  // connection too.
  auto& connection = pending.connection;
  std::string who = fmt::format("{}, from {}", printable(hello.identity), connection->peer());
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
  welcomes_[rank] = std::move(welcome);
  connection->limit_payload(wire::kMaxPayloadBytes);
  peers_[rank] = std::move(connection);
  log::debug("bootstrap: rank {} joined ({})", rank, who);
}

void StarServer::refuse(Pending& pending, const std::string& claim, const std::string& reason) {
  auto& connection = *pending.connection;
  std::string from = fmt::format("from {}{}", connection.peer(), claim.empty() ? "" : ", " + claim);
  note_stranger(fmt::format("rank 0 refused a connection {}: {}", from, reason));
  ++refused_;
  if (refusals_.size() == kRefusalsKept) refusals_.erase(refusals_.begin());
  refusals_.push_back(fmt::format("{}: {}", from, reason));
  // Delivered in the background (tend_closing): the rendezvous must not stall on a stranger.
  connection.discard_inbox();
  connection.queue(wire::Header{.kind = wire::Kind::abort},
                   wire::as_bytes(fmt::format("{}: rank 0 refused this rank: {}", kPhase, reason)));
  connection.flush();
  if (closing_.size() >= kMaxClosing) closing_.erase(closing_.begin());
  closing_.push_back({std::move(pending.connection), Deadline(kAbortLinger)});
}

void StarServer::note_stranger(const std::string& what) {
  ++strangers_logged_;
  if (strangers_logged_ <= kWarningsLogged) {
    log::warn("bootstrap: {}", what);
  } else {
    log::debug("bootstrap: {}", what);
  }
  if (strangers_logged_ == kWarningsLogged)
    log::warn(
        "bootstrap: {} connections refused or dropped so far; further ones are logged at "
        "debug level",
        strangers_logged_);
}

void StarServer::tend_closing() {
  for (auto& closing : closing_) {
    auto& connection = *closing.connection;
    if (!connection.closed()) {
      connection.flush();
      if (!connection.wants_write() && !closing.fin_sent) {
        connection.shutdown_write();
        closing.fin_sent = true;
      }
      connection.receive();
      connection.discard_inbox();
    }
    if (connection.closed() || closing.linger.expired()) closing.connection.reset();
  }
  std::erase_if(closing_, [](const Closing& closing) { return !closing.connection; });
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
