#include "control/tcp_bootstrap.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/signal_hygiene.hpp"
#include "control/star_client.hpp"
#include "control/star_server.hpp"

namespace proxyep::control {
namespace {

std::string error_phase(wire::Op op, std::string_view phase) {
  if (phase.empty()) return fmt::format("bootstrap.{}", wire::to_string(op));
  return fmt::format("bootstrap.{}({})", wire::to_string(op), phase);
}

}  // namespace

TcpBootstrap::TcpBootstrap(Options options)
    : env_(std::move(options.env)),
      timeout_(options.timeout),
      progress_(std::move(options.progress)) {
  // A rank of a program that did not start under `proxyep launch` (which opts its ranks out):
  // SIGTERM must stop it, not run exit(1) in a PSM library libfabric loaded.
  restore_signals_taken_by_libraries();
  env_.validate();
  require(timeout_.count() > 0, "bootstrap.rendezvous", "the timeout must be positive, got {} ms",
          timeout_.count());
  if (env_.world_size == 1) return;  // nobody to meet
  const std::string bind_host =
      options.listen_address.empty() ? env_.master_addr : options.listen_address;
  EndpointContext context{env_,
                          timeout_,
                          std::move(options.listen_address),
                          &progress_,
                          std::move(options.job_id),
                          std::move(options.secret)};
  if (env_.rank == 0) {
    endpoint_ = std::make_unique<StarServer>(std::move(context));
  } else {
    endpoint_ = std::make_unique<StarClient>(std::move(context));
  }
  liveness_ = Liveness::start(*this, bind_host, env_.master_addr, timeout_);
}

TcpBootstrap::~TcpBootstrap() = default;

Bytes TcpBootstrap::run(wire::Op op, int root, std::string_view phase,
                        std::span<const uint8_t> mine, std::chrono::milliseconds timeout) {
  const std::string where = error_phase(op, phase);
  require(failure_.empty(), where, "the bootstrap is unusable after an earlier failure: {}",
          failure_);
  // Bad input is rejected before anything is sent (and before it takes a sequence number): the
  // bootstrap stays usable.
  require(mine.size() + phase.size() + 4 <= wire::kMaxPayloadBytes, where,
          "{} bytes exceed the bootstrap's message limit of {} bytes", mine.size(),
          wire::kMaxPayloadBytes);
  CollectiveCall call{++seq_, op, root, std::string(phase), where, timeout};
  if (!endpoint_)
    return op == wire::Op::allgather ? wire::encode_list({Bytes(mine.begin(), mine.end())})
                                     : Bytes(mine.begin(), mine.end());
  try {
    return endpoint_->run(call, mine);
  } catch (const std::exception& e) {
    // The peers' state is now unknown (a frame may be half sent): tell them and stop here.
    failure_ = e.what();
    log::debug("bootstrap: {}", failure_);
    endpoint_->abort(failure_);
    throw;
  } catch (...) {
    failure_ =
        fmt::format("{}: the progress hook threw a non-standard exception", call.error_phase);
    endpoint_->abort(failure_);
    throw;
  }
}

std::vector<Bytes> TcpBootstrap::allgather(std::span<const uint8_t> mine, std::string_view phase) {
  Bytes result = run(wire::Op::allgather, 0, phase, mine);
  try {
    auto parts = wire::decode_list(result);
    require(parts.size() == static_cast<size_t>(env_.world_size),
            error_phase(wire::Op::allgather, phase),
            "rank 0 returned {} contributions for {} ranks", parts.size(), env_.world_size);
    return parts;
  } catch (const wire::BadFrame& e) {
    fail(error_phase(wire::Op::allgather, phase), "rank 0 sent a malformed result: {}", e.what());
  }
}

void TcpBootstrap::barrier(std::string_view phase) {
  run(wire::Op::barrier, 0, phase, {});
}

void TcpBootstrap::barrier(std::string_view phase, std::chrono::milliseconds timeout) {
  require(timeout.count() > 0, error_phase(wire::Op::barrier, phase),
          "a barrier's timeout must be positive (got {} ms)", timeout.count());
  run(wire::Op::barrier, 0, phase, {}, timeout);
}

Bytes TcpBootstrap::broadcast(std::span<const uint8_t> data, int root, std::string_view phase) {
  // Bad input is rejected before anything is sent: the bootstrap stays usable.
  require(root >= 0 && root < env_.world_size, error_phase(wire::Op::broadcast, phase),
          "root {} is out of range for WORLD_SIZE={}", root, env_.world_size);
  // Only the root's bytes travel; the others contribute nothing.
  auto mine = env_.rank == root ? data : std::span<const uint8_t>();
  return run(wire::Op::broadcast, root, phase, mine);
}

}  // namespace proxyep::control
