// common/crypto.hpp: libcrypto's HMAC-SHA256 and CSPRNG behind ProxyEP's membership proof and
// memory keys, checked against published vectors and for the properties callers rely on.
#include "common/crypto.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>

using namespace proxyep;

namespace {

std::span<const uint8_t> bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

}  // namespace

TEST_CASE("crypto: HMAC-SHA256 matches RFC 4231") {
  // Test case 2: a short key, a short message.
  CHECK(hex_string(hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block size (131 bytes of 0xaa).
  std::string long_key(131, '\xaa');
  CHECK(hex_string(hmac_sha256(bytes(long_key),
                               bytes("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // An empty key and message are valid input.
  CHECK(hex_string(hmac_sha256({}, {})) ==
        "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST_CASE("crypto: constant-time comparison") {
  Mac a = hmac_sha256(bytes("k"), bytes("m"));
  Mac b = a;
  CHECK(constant_time_equal(a, b));
  b[31] ^= 1;
  CHECK_FALSE(constant_time_equal(a, b));
  CHECK_FALSE(constant_time_equal(std::span(a).first(31), a));
  CHECK(constant_time_equal({}, {}));
}

TEST_CASE("crypto: random values do not repeat and use every bit") {
  std::set<uint64_t> seen;
  uint64_t ored = 0, anded = ~uint64_t{0};
  for (int i = 0; i < 256; ++i) {
    uint64_t value = secure_random_u64();
    seen.insert(value);
    ored |= value;
    anded &= value;
  }
  CHECK(seen.size() == 256);
  CHECK(ored == ~uint64_t{0});  // each bit set somewhere (fails with probability 64 x 2^-256)
  CHECK(anded == 0);
  std::vector<uint8_t> big(3 << 20);  // more than one RAND_bytes call
  secure_random_bytes(big);
  CHECK(std::set<uint8_t>(big.end() - 4096, big.end()).size() > 200);
}

TEST_CASE("crypto: SecretBytes moves, never copies, and random_hex is printable") {
  auto secret = SecretBytes::random_hex(32);
  REQUIRE(secret.size() == 64);
  for (uint8_t c : secret.bytes())
    CHECK(((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')));
  std::string first(secret.bytes().begin(), secret.bytes().end());
  auto other = SecretBytes::random_hex(32);
  CHECK(first != std::string(other.bytes().begin(), other.bytes().end()));
  SecretBytes moved(std::move(secret));
  CHECK(moved.size() == 64);
  CHECK(secret.empty());  // NOLINT(bugprone-use-after-move): moved-from is documented empty
  static_assert(!std::is_copy_constructible_v<SecretBytes>);
}
