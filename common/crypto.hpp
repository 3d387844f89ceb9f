// Cryptographic primitives, from OpenSSL's libcrypto (Debian's libssl-dev); nothing here is
// written by hand. Used where ProxyEP must not be guessable or forgeable: the bootstrap's
// membership proof (HMAC-SHA256 over the rendezvous handshake, control/rendezvous_auth.hpp),
// its nonces and the job secret `proxyep launch` generates, and fabric memory keys.
//
// secure_random_*: OpenSSL's process-wide DRBG (RAND_bytes), seeded from the operating system
// once per process and reseeded by OpenSSL itself; thread-safe and fork-safe. A failure (no
// entropy source) throws proxyep::Error("crypto") rather than returning predictable bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace proxyep {

constexpr size_t kMacBytes = 32;  // HMAC-SHA256
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256 of `message` under `key`. Throws proxyep::Error("crypto") if libcrypto fails.
Mac hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);

// Compares in time that depends only on the lengths (CRYPTO_memcmp): a MAC check must not tell
// an attacker how many leading bytes of a forgery were right.
bool constant_time_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Fills `out` from the CSPRNG. Throws proxyep::Error("crypto") on failure.
void secure_random_bytes(std::span<uint8_t> out);
uint64_t secure_random_u64();

// "3fa2..." : lower-case hex of `bytes` (for generated secrets and identifiers).
std::string hex_string(std::span<const uint8_t> bytes);

// Bytes that must not outlive their use: zeroed (OPENSSL_cleanse, which the compiler cannot drop)
// when destroyed or replaced. Move-only, so a secret is never copied by accident.
class SecretBytes {
 public:
  SecretBytes() = default;
  explicit SecretBytes(std::span<const uint8_t> bytes) : bytes_(bytes.begin(), bytes.end()) {}
  // Takes the buffer itself (no copy left behind).
  explicit SecretBytes(std::vector<uint8_t>&& bytes) : bytes_(std::move(bytes)) {}
  ~SecretBytes() { wipe(); }
  SecretBytes(SecretBytes&& other) noexcept : bytes_(std::move(other.bytes_)) {
    other.bytes_.clear();
  }
  SecretBytes& operator=(SecretBytes&& other) noexcept;
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;

  // `count` bytes from the CSPRNG, written as 2 x count lower-case hex digits (printable, so a
  // secret file can be copied and compared by hand); intermediate copies are wiped.
  static SecretBytes random_hex(size_t count);

  bool empty() const { return bytes_.empty(); }
  size_t size() const { return bytes_.size(); }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  void wipe() noexcept;
  std::vector<uint8_t> bytes_;
};

}  // namespace proxyep
