#include "common/crypto.hpp"

#include "common/error.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <string>

namespace proxyep {
namespace {

constexpr const char* kPhase = "crypto";

std::string openssl_error() {
  unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error recorded";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  ERR_clear_error();
  return text;
}

}  // namespace

Mac hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  require(key.size() <= INT_MAX, kPhase, "HMAC key of {} bytes is too long", key.size());
  Mac mac{};
  unsigned int length = 0;
  // A zero-length key is valid HMAC input; OpenSSL wants a non-null pointer for it.
  static const uint8_t kEmpty = 0;
  const uint8_t* data = message.empty() ? &kEmpty : message.data();
  const uint8_t* secret = key.empty() ? &kEmpty : key.data();
  if (HMAC(EVP_sha256(), secret, static_cast<int>(key.size()), data, message.size(), mac.data(),
           &length) == nullptr ||
      length != mac.size())
    fail(kPhase, "HMAC-SHA256 failed: {}", openssl_error());
  return mac;
}

bool constant_time_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void secure_random_bytes(std::span<uint8_t> out) {
  // RAND_bytes takes an int count: fill large requests in pieces.
  while (!out.empty()) {
    size_t piece = std::min<size_t>(out.size(), 1 << 20);
    if (RAND_bytes(out.data(), static_cast<int>(piece)) != 1)
      fail(kPhase, "the random generator failed (no entropy source?): {}", openssl_error());
    out = out.subspan(piece);
  }
}

uint64_t secure_random_u64() {
  std::array<uint8_t, 8> bytes{};
  secure_random_bytes(bytes);
  uint64_t value = 0;
  for (uint8_t byte : bytes)
    value = value << 8 | byte;
  return value;
}

std::string hex_string(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (uint8_t byte : bytes) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

SecretBytes& SecretBytes::operator=(SecretBytes&& other) noexcept {
  if (this != &other) {
    wipe();
    bytes_ = std::move(other.bytes_);
    other.bytes_.clear();
  }
  return *this;
}

SecretBytes SecretBytes::random_hex(size_t count) {
  static constexpr char kDigits[] = "0123456789abcdef";
  SecretBytes random{std::vector<uint8_t>(count)};
  secure_random_bytes(random.bytes_);
  std::vector<uint8_t> hex;
  hex.reserve(count * 2);
  for (uint8_t byte : random.bytes_) {
    hex.push_back(static_cast<uint8_t>(kDigits[byte >> 4]));
    hex.push_back(static_cast<uint8_t>(kDigits[byte & 15]));
  }
  return SecretBytes(std::move(hex));
}

void SecretBytes::wipe() noexcept {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  bytes_.clear();
}

}  // namespace proxyep
