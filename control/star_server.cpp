// StarServer, part 2: relaying collectives and failing them cleanly.
#include "control/star_server.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

namespace proxyep::control {
namespace {

std::string describe(wire::Op op, std::string_view phase, uint32_t root) {
  if (op == wire::Op::broadcast)
    return fmt::format("{}('{}', root {})", wire::to_string(op), phase, root);
  return fmt::format("{}('{}')", wire::to_string(op), phase);
}

}  // namespace

void StarServer::pump(const Deadline& deadline, const std::string& phase) {
  std::vector<pollfd> fds;
  std::vector<FramedConnection*> owners;
  if (listener_.valid()) {
    fds.push_back({listener_.fd(), POLLIN, 0});
    owners.push_back(nullptr);
  }
  auto watch = [&](const Connection& connection) {
    if (!connection || connection->closed()) return;
    short events = POLLIN;
    if (connection->wants_write()) events |= POLLOUT;
    fds.push_back({connection->fd(), events, 0});
    owners.push_back(connection.get());
  };
  for (const auto& pending : pending_)
    watch(pending.connection);
  for (const auto& closing : closing_)
    watch(closing.connection);
  for (const auto& connection : peers_)
    watch(connection);
  poll_slice(fds, deadline, progress(), phase);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (owners[i] == nullptr || fds[i].revents == 0) continue;
    if (fds[i].revents & POLLOUT) owners[i]->flush();
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) owners[i]->receive();
  }
}

std::optional<wire::Frame> StarServer::pop_checked(int rank, const std::string& phase) {
  try {
    return peers_[rank]->pop_frame();
  } catch (const wire::BadFrame& e) {
    fail(phase, "rank {} sent a malformed bootstrap frame: {}", rank, e.what());
  }
}

void StarServer::send_to_all(const wire::Header& header, std::span<const uint8_t> payload,
                             const std::string& phase) {
  for (auto& peer : peers_)
    if (peer) peer->queue(header, payload);
  flush_to_all(header.kind, phase);
}

void StarServer::flush_to_all(wire::Kind kind, const std::string& phase) {
  Deadline deadline(context_.timeout);
  while (true) {
    std::vector<int> behind;
    for (size_t rank = 1; rank < peers_.size(); ++rank) {
      auto& peer = *peers_[rank];
      if (!peer.wants_write()) continue;
      peer.flush();
      require(!peer.closed(), phase,
              "rank {} closed its bootstrap connection before receiving the {} ({})", rank,
              wire::to_string(kind), peer.close_reason());
      if (peer.wants_write()) behind.push_back(static_cast<int>(rank));
    }
    if (behind.empty()) return;
    require(!deadline.expired(), phase, "{} did not take the {} within {} ms", ranks_text(behind),
            wire::to_string(kind), context_.timeout.count());
    pump(deadline, phase);
  }
}

wire::Bytes StarServer::run(const CollectiveCall& call, std::span<const uint8_t> mine) {
  const int world = context_.env.world_size;
  const auto timeout = call.timeout_or(context_.timeout);
  Deadline deadline(timeout);
  std::vector<wire::Bytes> parts(world);
  std::vector<bool> have(world, false);
  parts[0].assign(mine.begin(), mine.end());
  have[0] = true;
  int missing = world - 1;
  // Tell the clients our deadline has started: they extend theirs, so rank 0's verdict (which
  // names the missing ranks) reaches them even when rank 0 arrives late.
  wire::Header enter{.kind = wire::Kind::enter,
                     .op = call.op,
                     .seq = call.seq,
                     .aux = static_cast<uint32_t>(call.root)};
  for (auto& peer : peers_)
    if (peer) peer->queue(enter, {});
  while (true) {
    for (int rank = 1; rank < world; ++rank)
      take_contributions(rank, call, parts, have, missing);
    if (missing == 0) break;
    if (deadline.expired()) {
      std::vector<int> absent;
      for (int rank = 1; rank < world; ++rank)
        if (!have[rank]) absent.push_back(rank);
      fail(call.error_phase, "{} did not arrive within {} ms", ranks_text(absent), timeout.count());
    }
    pump(deadline, call.error_phase);
  }
  wire::Bytes result = combine(call, parts);
  require(result.size() <= wire::kMaxPayloadBytes, call.error_phase,
          "the combined result of {} bytes exceeds the bootstrap's message limit of {} bytes",
          result.size(), wire::kMaxPayloadBytes);
  wire::Header header{.kind = wire::Kind::result,
                      .op = call.op,
                      .seq = call.seq,
                      .aux = static_cast<uint32_t>(call.root)};
  send_to_all(header, result, call.error_phase);
  return result;
}

void StarServer::take_contributions(int rank, const CollectiveCall& call,
                                    std::vector<wire::Bytes>& parts, std::vector<bool>& have,
                                    int& missing) {
  const auto& phase = call.error_phase;
  auto& peer = *peers_[rank];
  while (auto frame = pop_checked(rank, phase)) {
    const auto& header = frame->header;
    require(header.kind != wire::Kind::abort, phase, "rank {} failed: {}", rank,
            wire::as_text(frame->payload));
    require(header.kind == wire::Kind::contribute, phase,
            "rank {} sent an unexpected '{}' frame during {}", rank, wire::to_string(header.kind),
            describe(call.op, call.phase, call.root));
    wire::Contribution contribution;
    try {
      contribution = wire::decode_contribution(frame->payload);
    } catch (const wire::BadFrame& e) {
      fail(phase, "rank {} sent a malformed contribution: {}", rank, e.what());
    }
    bool same = header.seq == call.seq && header.op == call.op &&
                contribution.phase == call.phase &&
                (call.op != wire::Op::broadcast || header.aux == static_cast<uint32_t>(call.root));
    require(same, phase,
            "rank {} called {} as bootstrap collective #{} while rank 0 called {} as #{}: every "
            "rank must call the same collectives in the same order",
            rank, describe(header.op, contribution.phase, header.aux), header.seq,
            describe(call.op, call.phase, call.root), call.seq);
    require(!have[rank], phase, "rank {} contributed twice to collective #{}", rank, call.seq);
    parts[rank] = std::move(contribution.data);
    have[rank] = true;
    --missing;
  }
  require(!peer.closed(), phase, "rank {} closed its bootstrap connection during {} ({})", rank,
          describe(call.op, call.phase, call.root), peer.close_reason());
}

wire::Bytes StarServer::combine(const CollectiveCall& call, std::vector<wire::Bytes>& parts) const {
  switch (call.op) {
    case wire::Op::allgather:
      return wire::encode_list(parts);
    case wire::Op::broadcast:
      return std::move(parts[call.root]);
    default:
      return {};
  }
}

void StarServer::abort(const std::string& reason) noexcept {
  try {
    std::vector<FramedConnection*> open;
    wire::Header header{.kind = wire::Kind::abort};
    auto notify = [&](Connection& connection) {
      if (!connection || connection->closed()) return;
      connection->queue(header, wire::as_bytes(reason));
      open.push_back(connection.get());
    };
    for (auto& pending : pending_)
      notify(pending.connection);
    for (auto& connection : peers_)
      notify(connection);
    close_gracefully(open, kAbortLinger);
  } catch (...) {
    // Telling the peers is best effort; closing below is not.
  }
  for (auto& pending : pending_)
    if (pending.connection) pending.connection->close();
  closing_.clear();
  for (auto& connection : peers_)
    if (connection) connection->close();
  listener_.close();
}

}  // namespace proxyep::control
