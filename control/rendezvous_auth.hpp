// Who may join a rendezvous: the membership proof of the TCP bootstrap (control/tcp_bootstrap.hpp).
//
// Threat: anything that can reach MASTER_ADDR:MASTER_PORT (a port scanner, a stray process, a
// second job that happens to use the same port, someone on the network) must not end rank 0,
// take a rank's place, or pair up with this job's ranks; and a rank must not join another job's
// rank 0.
//
// Two things are checked, in the handshake's first frames (wire format: bootstrap_wire.hpp):
// - the job identity (a label, not a secret): every rank must carry the same job id
//   (bootstrap.job_id; else torchrun's TORCHELASTIC_RUN_ID; else none). It keeps jobs from
//   mixing by accident. Rank 0 sends its job id in the challenge, so a client of another job
//   fails at once naming both ids, and rank 0 refuses a hello with another id.
// - with a job secret (bootstrap.secret_file or bootstrap.secret; `proxyep launch` makes one),
//   a challenge-response over HMAC-SHA256 in both directions:
//     0 -> client  challenge: Ns (32 random bytes, fresh per connection)
//     client -> 0  hello:     rank, world size, job id, Nc (32 random bytes), identity,
//                             MAC_K("hello"   | rank | world | job id | Ns | Nc | identity)
//     0 -> client  welcome:   MAC_K("welcome" | rank | world | job id | Ns | Nc | identity)
//   Each MAC binds everything the hello claims and both nonces, so a recorded hello is worthless
//   against another connection (another Ns) and a recorded welcome against another client (another
//   Nc); the labels keep one direction's MAC from serving as the other's. Rank 0 checks the
//   hello before it looks at the claimed rank; a client checks the welcome before it trusts
//   rank 0 with anything.
// What is refused (a stranger's frame: malformed, another protocol version, another job id, no
// or a bad MAC) is logged by rank 0, answered with an abort frame saying why, and dropped; it
// never ends rank 0's rendezvous and never takes a rank's place. A proven member that conflicts
// (a rank claimed twice, another WORLD_SIZE) is a broken launch and still fails the world.
// Not protected (docs/SECURITY.md): without a secret, anyone who learns or guesses the job id;
// frames after the handshake carry no MAC (an attacker who can inject into or take over an
// established TCP connection is not kept out); nothing is encrypted; the fabric's data path.
#pragma once

#include "common/crypto.hpp"
#include "control/bootstrap_wire.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace proxyep::control {

// What one handshake claims; both MACs cover all of it.
struct HandshakeClaims {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string_view job_id;
  const wire::Nonce* server_nonce = nullptr;
  const wire::Nonce* client_nonce = nullptr;
  std::string_view identity;
};

Mac hello_mac(const SecretBytes& secret, const HandshakeClaims& claims);
Mac welcome_mac(const SecretBytes& secret, const HandshakeClaims& claims);

// A fresh nonce from the CSPRNG.
wire::Nonce fresh_nonce();

// Text a stranger sent, made safe to log: control characters escaped, at most `max` characters.
std::string printable(std::string_view untrusted, size_t max = 96);
// "'launch-3fa2...'" or "none": a job id as messages quote it (printable()).
std::string job_label(std::string_view job_id);

}  // namespace proxyep::control
