// The two roles of the TCP bootstrap's star (control/tcp_bootstrap.hpp): rank 0 serves
// (StarServer), every other rank is a client (StarClient). Both run one collective at a time
// for the single thread that owns the TcpBootstrap; TcpBootstrap numbers the calls, names the
// phases and decodes the results, the endpoints move the bytes and enforce the deadlines.
#pragma once

#include "common/crypto.hpp"
#include "control/bootstrap_wire.hpp"
#include "control/launch_env.hpp"
#include "control/tcp_socket.hpp"

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace proxyep::control {

// One collective as every rank must call it: same seq, op, root and phase text.
struct CollectiveCall {
  uint32_t seq = 0;
  wire::Op op = wire::Op::barrier;
  int root = 0;             // broadcast's root; 0 for the others
  std::string phase;        // the caller's phase text, compared across ranks
  std::string error_phase;  // "bootstrap.allgather(fabric addresses)": phase of our errors
  // How long the collective may take; zero: the bootstrap's timeout. Longer for a collective
  // that follows work whose length grows with the job (opening every fabric connection).
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds timeout_or(std::chrono::milliseconds fallback) const {
    return timeout.count() > 0 ? timeout : fallback;
  }
};

// What both roles share: who we are, how long any wait may take, the job's credentials
// (control/rendezvous_auth.hpp), and the hook to drive while waiting (owned by the TcpBootstrap,
// which may replace it between calls).
struct EndpointContext {
  LaunchEnv env;
  std::chrono::milliseconds timeout{30000};
  std::string listen_address;  // rank 0 binds here; empty = env.master_addr
  const ProgressFn* progress = nullptr;
  std::string job_id;                         // every rank's must be equal; "" = none
  std::shared_ptr<const SecretBytes> secret;  // null = the job has no secret
};

class StarEndpoint {
 public:
  virtual ~StarEndpoint() = default;
  // Contributes `mine` to `call` and returns the result payload: allgather -> wire::encode_list
  // of every rank's bytes; broadcast -> the root's bytes; barrier -> empty. Throws
  // proxyep::Error (phase = call.error_phase) naming the ranks at fault.
  virtual wire::Bytes run(const CollectiveCall& call, std::span<const uint8_t> mine) = 0;
  // After a failure: tell the peers `reason` (best effort, bounded) and close every connection.
  virtual void abort(const std::string& reason) noexcept = 0;
};

// "rank 2", "ranks 2, 3", "ranks 2-9, 12": for messages that name ranks.
std::string ranks_text(const std::vector<int>& ranks);

// How long a client waits beyond the timeout for rank 0's verdict (the names of the missing
// ranks) before it gives up on rank 0 itself.
std::chrono::milliseconds verdict_grace(std::chrono::milliseconds timeout);

// How long a failing endpoint keeps a connection open to deliver its abort frame.
constexpr std::chrono::milliseconds kAbortLinger{300};

}  // namespace proxyep::control
