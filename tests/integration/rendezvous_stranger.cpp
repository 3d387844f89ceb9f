// A stranger at a job's rendezvous: connects to MASTER_ADDR:MASTER_PORT (127.0.0.1 only) while the
// job is meeting, claims a rank with a hello rank 0 must refuse, and reports what rank 0 said.
//   --as v1       an old-style (version 1) hello, as a previous ProxyEP build sends it
//   --as bad-mac  a version 2 hello of the right job id whose MAC is under a random key
//   --claim R     the rank it claims (default 1)
// Exit 0 when rank 0 refused it (printing the reason), 1 when it was not refused, 2 on misuse.
#include "common/crypto.hpp"
#include "common/registry.hpp"
#include "control/bootstrap_wire.hpp"
#include "control/launch_env.hpp"
#include "control/rendezvous_auth.hpp"
#include "tests/unit/control/raw_peer.hpp"

#include <fmt/format.h>

#include <string>

using namespace proxyep;
using namespace proxyep::control;

int main(int argc, char** argv) {
  std::string as = "v1";
  uint32_t claim = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--as") {
      as = argv[i + 1];
    } else if (flag == "--claim") {
      claim = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    } else {
      fmt::print(stderr, "usage: {} [--as v1|bad-mac] [--claim RANK]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto env = LaunchEnv::from_environment();
    auto world = static_cast<uint32_t>(env.world_size);
    auto peer = testing::RawPeer::connect(env.master_port, std::chrono::seconds(30));
    wire::Header hello{.kind = wire::Kind::hello, .rank = claim, .aux = world};
    if (as == "v1") {
      // A version 1 rank speaks first and sends no job id or MAC.
      hello.version = 1;
      peer.send(hello, wire::as_bytes("pid 1 on host stranger"));
    } else if (as == "bad-mac") {
      auto frame = peer.read_until(wire::Kind::challenge, std::chrono::seconds(30));
      if (!frame) {
        fmt::print(stderr, "stranger: rank 0 sent no challenge\n");
        return 1;
      }
      auto challenge = wire::decode_challenge(frame->payload);
      // The job id is no secret: rank 0 just said it. The key is a guess.
      SecretBytes guess = SecretBytes::random_hex(32);
      wire::Hello body{challenge.job_id, fresh_nonce(), std::nullopt, "pid 1 on host stranger"};
      HandshakeClaims claims{claim,       world,        body.job_id, &challenge.nonce,
                             &body.nonce, body.identity};
      body.mac = hello_mac(guess, claims);
      peer.send(hello, wire::encode_hello(body));
    } else {
      fmt::print(stderr, "stranger: unknown --as {}\n", as);
      return 2;
    }
    auto answer = peer.read_until(wire::Kind::abort, std::chrono::seconds(30));
    if (!answer) {
      fmt::print(stderr, "stranger ({}): rank 0 did not refuse it\n", as);
      return 1;
    }
    fmt::print("stranger ({}): {}\n", as, wire::as_text(answer->payload));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "stranger: error: {}\n", e.what());
    return 2;
  }
}
