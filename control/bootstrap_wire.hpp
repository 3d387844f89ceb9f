// Wire format of the TCP bootstrap (control/tcp_bootstrap.hpp). Every message is one frame:
// a fixed 24-byte header followed by `length` payload bytes. All integers are little-endian,
// written byte by byte, so ranks on different hosts agree whatever their compilers pack.
//
//   offset size field
//        0    4 magic    kMagic: tells a bootstrap peer from a stray connection (port scanner,
//                        a different service on MASTER_PORT)
//        4    2 version  kVersion: mixed ProxyEP versions fail at the handshake, not later
//        6    1 kind     Kind below
//        7    1 op       Op of the collective the frame belongs to (rendezvous for hello/welcome)
//        8    4 seq      collective sequence number: 0 = rendezvous, then 1, 2, ... per call
//       12    4 rank     sender's rank (rank 0 for frames from the server)
//       16    4 aux      hello: sender's world size; broadcast frames: the root; else 0
//       20    4 length   payload bytes, at most kMaxPayloadBytes
//
// Conversation (rank 0 is the server of a star; the other ranks are clients):
//   0 -> client: challenge(payload = flags, server nonce Ns, rank 0's job id)   on accept
//   client -> 0: hello(rank, world size, payload = job id, client nonce Nc, MAC, "pid P on host H")
//   0 -> client: welcome(payload = MAC)       once every rank has said hello
//   0 -> client: abort(reason)                instead, when rank 0 refuses the hello
//   per collective, seq = 1, 2, ...:
//   0 -> client: enter(seq)                   rank 0 is inside collective seq: its deadline runs
//   client -> 0: contribute(seq, op, root, payload = phase text + data)
//   0 -> client: result(seq, op, payload)     allgather: encode_list(); broadcast: root's bytes
//   either way:  abort(payload = reason)      the sender failed; the receiver fails with reason
// The MACs (control/rendezvous_auth.hpp) are HMAC-SHA256 under the job's secret, empty when the
// job has none; the handshake payloads are at most kMaxHandshakeBytes.
//
// Handshake payloads (after the header; integers little-endian, strings as u32 length + bytes):
//   challenge: u8 flags (bit 0: rank 0 has a job secret) | Ns[32] | job id
//   hello:     job id | Nc[32] | u8 MAC length (0 or 32) | MAC | identity text (to the end)
//   welcome:   u8 MAC length (0 or 32) | MAC
// Version 1 (no challenge, no job id, no MAC) is refused by version 2's rank 0 as a stranger.
#pragma once

#include "common/crypto.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::control::wire {

using Bytes = std::vector<uint8_t>;

constexpr uint32_t kMagic = 0x42455850;  // "PXEB" in little-endian byte order
constexpr uint16_t kVersion = 2;         // 2: challenge, job id and MACs in the handshake
constexpr size_t kHeaderBytes = 24;
// Bootstrap traffic is addresses and region descriptors (KiB); a larger length is garbage.
constexpr uint32_t kMaxPayloadBytes = 256u << 20;
// Before a connection has proven it belongs to the job, rank 0 takes at most this much from it.
constexpr uint32_t kMaxHandshakeBytes = 4096;
constexpr size_t kMaxJobIdBytes = 256;
constexpr size_t kNonceBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;

enum class Kind : uint8_t {
  hello = 1,
  welcome = 2,
  enter = 3,
  contribute = 4,
  result = 5,
  abort = 6,
  challenge = 7
};
enum class Op : uint8_t { rendezvous = 0, allgather = 1, barrier = 2, broadcast = 3 };

std::string_view to_string(Kind kind);
std::string_view to_string(Op op);

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  Kind kind = Kind::abort;
  Op op = Op::rendezvous;
  uint32_t seq = 0;
  uint32_t rank = 0;
  uint32_t aux = 0;
  uint32_t length = 0;
};

struct Frame {
  Header header;
  Bytes payload;
};

// A byte stream that is not a bootstrap peer, or a frame that breaks the format.
class BadFrame : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Header + payload, ready to send. Sets header.length from the payload size.
Bytes encode_frame(Header header, std::span<const uint8_t> payload);
// Decodes the header at the start of `bytes`. Throws BadFrame when `bytes` is shorter than
// kHeaderBytes, on a wrong magic or an oversized length; the version is left for the handshake
// to judge.
Header decode_header(std::span<const uint8_t> bytes);

struct Challenge {
  bool secret_required = false;  // rank 0 has a job secret: a hello must carry a MAC
  Nonce nonce{};                 // Ns: fresh per connection, so a recorded hello is worthless
  std::string job_id;
};
struct Hello {
  std::string job_id;
  Nonce nonce{};           // Nc: fresh per connection, so a recorded welcome is worthless
  std::optional<Mac> mac;  // present when this rank has a job secret
  std::string identity;    // "pid P on host H", for messages
};
struct Welcome {
  std::optional<Mac> mac;  // present when rank 0 has a job secret
};

// Handshake payloads; the decoders throw BadFrame on a truncated, oversized or trailing field.
Bytes encode_challenge(const Challenge& challenge);
Challenge decode_challenge(std::span<const uint8_t> payload);
Bytes encode_hello(const Hello& hello);
Hello decode_hello(std::span<const uint8_t> payload);
Bytes encode_welcome(const Welcome& welcome);
Welcome decode_welcome(std::span<const uint8_t> payload);

// Contribution payload: u32 phase length, phase text, data.
Bytes encode_contribution(std::string_view phase, std::span<const uint8_t> data);
struct Contribution {
  std::string phase;
  Bytes data;
};
Contribution decode_contribution(std::span<const uint8_t> payload);  // throws BadFrame

// Allgather result: u32 count, count x u32 sizes, the parts back to back.
Bytes encode_list(const std::vector<Bytes>& parts);
std::vector<Bytes> decode_list(std::span<const uint8_t> payload);  // throws BadFrame

inline std::span<const uint8_t> as_bytes(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}
inline std::string as_text(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace proxyep::control::wire
