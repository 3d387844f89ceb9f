#include "control/rendezvous_auth.hpp"

#include <fmt/format.h>

namespace proxyep::control {
namespace {

void put_u32(wire::Bytes& out, uint32_t value) {
  for (int shift = 0; shift < 32; shift += 8)
    out.push_back(static_cast<uint8_t>(value >> shift));
}

void put_text(wire::Bytes& out, std::string_view text) {
  put_u32(out, static_cast<uint32_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
}

// The MAC input: a label naming the protocol, version and direction, then every claim with its
// length, so no two different transcripts encode to the same bytes.
wire::Bytes transcript(std::string_view direction, const HandshakeClaims& claims) {
  wire::Bytes out;
  put_text(out, fmt::format("proxyep bootstrap v{} {}", wire::kVersion, direction));
  put_u32(out, claims.rank);
  put_u32(out, claims.world_size);
  put_text(out, claims.job_id);
  out.insert(out.end(), claims.server_nonce->begin(), claims.server_nonce->end());
  out.insert(out.end(), claims.client_nonce->begin(), claims.client_nonce->end());
  put_text(out, claims.identity);
  return out;
}

}  // namespace

Mac hello_mac(const SecretBytes& secret, const HandshakeClaims& claims) {
  return hmac_sha256(secret.bytes(), transcript("hello", claims));
}

Mac welcome_mac(const SecretBytes& secret, const HandshakeClaims& claims) {
  return hmac_sha256(secret.bytes(), transcript("welcome", claims));
}

wire::Nonce fresh_nonce() {
  wire::Nonce nonce{};
  secure_random_bytes(nonce);
  return nonce;
}

std::string printable(std::string_view untrusted, size_t max) {
  std::string out;
  for (char c : untrusted) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\')
      out.push_back(c);
    else
      out += fmt::format("\\x{:02x}", byte);
  }
  return out;
}

std::string job_label(std::string_view job_id) {
  return job_id.empty() ? std::string("none") : fmt::format("'{}'", printable(job_id));
}

}  // namespace proxyep::control
