#include "control/star_client.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "control/rendezvous_auth.hpp"

#include <unistd.h>

#include <algorithm>

namespace proxyep::control {
namespace {

const std::string kPhase = "bootstrap.rendezvous";
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kMaxBackoff{200};

std::string identity() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return fmt::format("pid {} on host {}", getpid(), host);
}

// Rank 0's abort names the culprits; its phase is usually ours, so say it once.
[[noreturn]] void fail_with_verdict(const std::string& phase, std::span<const uint8_t> payload) {
  std::string reason = wire::as_text(payload);
  std::string ours = phase + ": ";
  if (reason.starts_with(ours)) fail(phase, "{} (reported by rank 0)", reason.substr(ours.size()));
  fail(phase, "rank 0 failed: {}", reason);
}

std::string describe(const CollectiveCall& call) {
  auto root = call.op == wire::Op::broadcast ? fmt::format(", root {}", call.root) : "";
  return fmt::format("{}('{}'{}) (collective #{})", wire::to_string(call.op), call.phase, root,
                     call.seq);
}

}  // namespace

StarClient::StarClient(EndpointContext context) : context_(std::move(context)) {
  // One deadline for the whole rendezvous: a connection rank 0 closed before it admitted this
  // rank (it drops the oldest unscreened connection when a flood fills its cap) is made again,
  // with backoff, until then. Any other failure (a refusal, another job, a timeout) is final.
  Deadline deadline(context_.timeout);
  auto backoff = kFirstBackoff;
  for (int attempt = 1;; ++attempt) {
    connect_to_server(deadline);
    try {
      handshake();
      return;
    } catch (const std::exception& e) {
      if (!closed_before_welcome_ || deadline.expired()) {
        abort(e.what());
        throw;
      }
      lost_ = fmt::format("rank 0 closed {} connection{} before admitting this rank, the last: {}",
                          attempt, attempt == 1 ? "" : "s", e.what());
      log::debug("bootstrap: {}; connecting again", lost_);
      connection_.reset();
      closed_before_welcome_ = false;
      sleep_slices(backoff, deadline, progress(), kPhase);
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
}

StarClient::~StarClient() = default;

std::string StarClient::server() const {
  return fmt::format("rank 0 (rendezvous server at {}:{})", context_.env.master_addr,
                     context_.env.master_port);
}

void StarClient::connect_to_server(const Deadline& deadline) {
  const auto& env = context_.env;
  std::string error;  // the last attempt's failure, for the message
  auto backoff = kFirstBackoff;
  // Rank 0 may start after us (or its host may not resolve yet): retry until the deadline.
  while (!deadline.expired()) {
    auto socket = connect_once(env.master_addr, env.master_port, deadline, progress(), error);
    if (socket) {
      auto name = fmt::format("{}:{}", env.master_addr, env.master_port);
      connection_ = std::make_unique<FramedConnection>(std::move(*socket), std::move(name));
      return;
    }
    sleep_slices(backoff, deadline, progress(), kPhase);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  fail(kPhase, "{} unreachable within {} ms (rank {} tried to connect; last error: {}{})", server(),
       context_.timeout.count(), env.rank, error.empty() ? "no attempt finished" : error,
       lost_.empty() ? "" : "; earlier, " + lost_);
}

void StarClient::handshake() {
  const auto& env = context_.env;
  handshaking_ = true;
  const auto wait = context_.timeout + verdict_grace(context_.timeout);
  wire::Challenge challenge = receive_challenge(wait);
  wire::Hello hello{context_.job_id, fresh_nonce(), std::nullopt, identity()};
  HandshakeClaims claims{static_cast<uint32_t>(env.rank),
                         static_cast<uint32_t>(env.world_size),
                         hello.job_id,
                         &challenge.nonce,
                         &hello.nonce,
                         hello.identity};
  if (context_.secret) hello.mac = hello_mac(*context_.secret, claims);
  // Sent even when this rank sees below that it will not join: rank 0 logs the refusal.
  connection_->queue(wire::Header{.kind = wire::Kind::hello,
                                  .rank = static_cast<uint32_t>(env.rank),
                                  .aux = static_cast<uint32_t>(env.world_size)},
                     wire::encode_hello(hello));
  connection_->flush();
  require(challenge.job_id == context_.job_id, kPhase,
          "{} serves another job: its job id is {}, this rank's is {} (two jobs share "
          "MASTER_ADDR:MASTER_PORT, or this job's ranks were given different job ids: "
          "bootstrap.job_id, TORCHELASTIC_RUN_ID)",
          server(), job_label(challenge.job_id), job_label(context_.job_id));
  require(challenge.secret_required || !context_.secret, kPhase,
          "this rank has a job secret but {} has none (or is not this job's rank 0): give every "
          "rank the same bootstrap.secret_file",
          server());
  require(!challenge.secret_required || context_.secret, kPhase,
          "{} requires the job's secret but this rank has none: give every rank the same "
          "bootstrap.secret_file (proxyep launch makes one for its ranks)",
          server());
  receive_welcome(claims, wait);
  handshaking_ = false;
  log::debug("bootstrap: rank {} joined {} (job {}{})", env.rank, server(),
             job_label(context_.job_id), context_.secret ? ", rank 0 proved the secret" : "");
}

wire::Challenge StarClient::receive_challenge(std::chrono::milliseconds wait) {
  auto frame = next_frame(Deadline(wait), kPhase, "the rendezvous");
  require(frame.has_value(), kPhase,
          "{} accepted the connection of rank {} but sent no challenge within {} ms (not a "
          "ProxyEP rendezvous of this version?)",
          server(), context_.env.rank, wait.count());
  require(frame->header.kind == wire::Kind::challenge, kPhase,
          "{} sent an unexpected '{}' frame instead of its challenge", server(),
          wire::to_string(frame->header.kind));
  try {
    return wire::decode_challenge(frame->payload);
  } catch (const wire::BadFrame& e) {
    fail(kPhase, "{} sent a malformed challenge: {}", server(), e.what());
  }
}

void StarClient::receive_welcome(const HandshakeClaims& claims, std::chrono::milliseconds wait) {
  auto frame = next_frame(Deadline(wait), kPhase, "the rendezvous");
  require(frame.has_value(), kPhase,
          "{} accepted the connection of rank {} but did not complete the rendezvous within {} ms",
          server(), context_.env.rank, wait.count());
  require(frame->header.kind == wire::Kind::welcome, kPhase,
          "{} sent an unexpected '{}' frame during the rendezvous", server(),
          wire::to_string(frame->header.kind));
  wire::Welcome welcome;
  try {
    welcome = wire::decode_welcome(frame->payload);
  } catch (const wire::BadFrame& e) {
    fail(kPhase, "{} sent a malformed welcome: {}", server(), e.what());
  }
  if (!context_.secret) return;
  bool proven = welcome.mac.has_value() &&
                constant_time_equal(*welcome.mac, welcome_mac(*context_.secret, claims));
  require(proven, kPhase,
          "{} did not prove that it knows the job's secret: it is not this job's rank 0 (or was "
          "given another secret); this rank does not join it",
          server());
}

std::optional<wire::Frame> StarClient::next_frame(const Deadline& deadline,
                                                  const std::string& phase,
                                                  const std::string& during) {
  auto& connection = *connection_;
  while (true) {
    std::optional<wire::Frame> frame;
    try {
      frame = connection.pop_frame();
    } catch (const wire::BadFrame& e) {
      fail(phase, "{} is not speaking the ProxyEP bootstrap protocol: {}", server(), e.what());
    }
    if (frame) {
      require(frame->header.version == wire::kVersion, phase,
              "{} speaks bootstrap protocol version {}, this rank version {}", server(),
              frame->header.version, wire::kVersion);
      if (frame->header.kind == wire::Kind::abort) fail_with_verdict(phase, frame->payload);
      return frame;
    }
    if (connection.closed()) {
      closed_before_welcome_ = handshaking_;
      fail(phase, "rank 0 closed its bootstrap connection during {} ({})", during,
           connection.close_reason());
    }
    if (deadline.expired()) return std::nullopt;
    short events = POLLIN;
    if (connection.wants_write()) events |= POLLOUT;
    pollfd pfd{connection.fd(), events, 0};
    poll_slice(std::span(&pfd, 1), deadline, progress(), phase);
    if (pfd.revents & POLLOUT) connection.flush();
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) connection.receive();
  }
}

wire::Bytes StarClient::run(const CollectiveCall& call, std::span<const uint8_t> mine) {
  const auto& phase = call.error_phase;
  const auto root = static_cast<uint32_t>(call.root);
  wire::Header header{.kind = wire::Kind::contribute,
                      .op = call.op,
                      .seq = call.seq,
                      .rank = static_cast<uint32_t>(context_.env.rank),
                      .aux = root};
  connection_->queue(header, wire::encode_contribution(call.phase, mine));
  connection_->flush();
  const auto timeout = call.timeout_or(context_.timeout);
  const auto wait = timeout + verdict_grace(timeout);
  const auto during = describe(call);
  Deadline deadline(wait);
  bool entered = false;
  while (true) {
    auto frame = next_frame(deadline, phase, during);
    if (!frame && !entered)
      fail(phase, "rank 0 did not join {} within {} ms", during, wait.count());
    require(frame.has_value(), phase, "rank 0 joined {} but sent no result within {} ms", during,
            wait.count());
    const auto& got = frame->header;
    bool same = got.seq == call.seq && got.op == call.op &&
                (call.op != wire::Op::broadcast || got.aux == root);
    if (!same) {
      auto root_text = got.op == wire::Op::broadcast ? fmt::format(", root {}", got.aux) : "";
      fail(phase,
           "rank 0 is in {} (collective #{}{}) while this rank called {}: every rank must call "
           "the same collectives in the same order",
           wire::to_string(got.op), got.seq, root_text, during);
    }
    if (got.kind == wire::Kind::result) return std::move(frame->payload);
    require(got.kind == wire::Kind::enter, phase, "rank 0 sent an unexpected '{}' frame during {}",
            wire::to_string(got.kind), during);
    // Rank 0's clock for this collective starts now; give its verdict time to come.
    entered = true;
    deadline = Deadline(wait);
  }
}

void StarClient::abort(const std::string& reason) noexcept {
  if (!connection_) return;
  try {
    if (!connection_->closed()) {
      connection_->queue(
          wire::Header{.kind = wire::Kind::abort, .rank = static_cast<uint32_t>(context_.env.rank)},
          wire::as_bytes(reason));
    }
    FramedConnection* connections[] = {connection_.get()};
    close_gracefully(connections, kAbortLinger);
  } catch (...) {
    // Best effort: the connection is closed below either way.
  }
  connection_->close();
}

}  // namespace proxyep::control
