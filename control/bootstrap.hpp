// Bootstrap: the out-of-band channel ranks use before (and beside) the fabric: rendezvous,
// allgather of fabric addresses and memory descriptors, barrier, broadcast. Modelled on NCCL's
// bootstrap surface. The TCP implementation is a star: rank 0 serves MASTER_ADDR:MASTER_PORT,
// every other rank connects (retrying until the deadline) and collectives relay through rank 0.
//
// Guarantees:
// - Every wait is bounded by the timeout (bootstrap.timeout_ms). A timeout throws
//   proxyep::Error whose phase is the collective's name and whose message names the ranks that
//   did not arrive; rank 0 tells the ranks still connected, so all of them fail with the names.
// - A peer whose connection drops makes the collective fail at once, naming that rank.
// - Waits call the progress hook between polls of the sockets: manual-progress providers
//   (tcp;ofi_rxm, shm, efa) stall unless someone keeps reading their CQ.
// - Collectives are matched by sequence number; ranks calling different collectives get an
//   error, not a silent mix-up. Every rank must pass the same `phase` text to a collective.
// - Errors: proxyep::Error whose phase is "bootstrap.rendezvous" or "bootstrap.<op>(<phase>)",
//   e.g. "bootstrap.allgather(fabric addresses)". After a failure the object is unusable (every
//   call throws, repeating the first failure); destroy it to close the connections.
// - Only the job's own ranks join: every rank carries the job's id and, when the job has a
//   secret, proves it to rank 0 and rank 0 proves it back; a stranger's connection is refused,
//   logged and dropped without ending or disturbing the rendezvous
//   (control/rendezvous_auth.hpp).
// - One thread uses an instance at a time; the progress hook runs on that thread.
// Implementation and wire protocol: control/tcp_bootstrap.hpp.
#pragma once

#include "common/crypto.hpp"
#include "control/launch_env.hpp"
#include "control/peer_watch.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::control {

using Bytes = std::vector<uint8_t>;

class Bootstrap {
 public:
  struct Options {
    LaunchEnv env;
    std::chrono::milliseconds timeout{30000};
    std::function<void()> progress;  // called between socket polls while waiting; may be empty
    std::string listen_address;      // rank 0 binds here (bootstrap.interface); empty = master_addr
    // Membership (control/rendezvous_auth.hpp): every rank must carry the same job id, and
    // with a secret, prove it in the handshake.
    std::string job_id;                         // "" = none
    std::shared_ptr<const SecretBytes> secret;  // null = none
  };

  // TCP rendezvous over env.master_addr:master_port. Returns once every rank has connected.
  static std::unique_ptr<Bootstrap> connect(Options options);
  // Options from the environment and the parameter registry (bootstrap.timeout_ms,
  // bootstrap.interface; the job id and secret as control/job_credentials.hpp reads them).
  static std::unique_ptr<Bootstrap> from_environment(std::function<void()> progress = {});
  // What from_environment connects with, for a launch environment given by the caller (the
  // Python module builds it from a torch.distributed group).
  static Options options_for(LaunchEnv env);

  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const LaunchEnv& env() const = 0;

  virtual void set_progress(std::function<void()> progress) = 0;

  // Every rank contributes `mine` (sizes may differ); returns all contributions, index = rank.
  virtual std::vector<Bytes> allgather(std::span<const uint8_t> mine, std::string_view phase) = 0;
  virtual void barrier(std::string_view phase) = 0;
  // A barrier that may take up to `timeout` instead of the bootstrap's own timeout (every rank
  // passes the same): after work whose length grows with the job.
  virtual void barrier(std::string_view phase, std::chrono::milliseconds timeout) = 0;
  // Root's `data` reaches every rank (others' `data` is ignored).
  virtual Bytes broadcast(std::span<const uint8_t> data, int root, std::string_view phase) = 0;

  // Peers known to have left the job (any thread, at any time; liveness.hpp). Null when this
  // bootstrap cannot tell (a world of one).
  virtual const PeerWatch* peer_watch() const { return nullptr; }
};

}  // namespace proxyep::control
