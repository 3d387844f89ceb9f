#include "gpu_side/ep/numeric.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

using namespace proxyep::gpu_side::ep;

namespace {

// Small deterministic generator for test inputs.
uint32_t next_random(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<uint32_t>(state >> 32);
}

bool bf16_is_nan(uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
}

// bf16 pattern of magnitude code `m` (sign taken from `sign`) as a double; 0x7f80 counts as
// 2^128, the value overflow rounds towards.
double bf16_value(uint16_t b) {
  if ((b & 0x7fff) == 0x7f80) return (b & 0x8000) ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
  return bf16_to_float(b);
}

// Nearest e4m3 code by brute force over all finite codes, ties to the even code, saturating.
uint8_t e4m3_brute_force(float value) {
  double magnitude = std::fabs(static_cast<double>(value));
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7e; ++code) {
    double distance = std::fabs(e4m3_to_float(static_cast<uint8_t>(code)) - magnitude);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = static_cast<uint8_t>(code);
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(value) ? 0x80 : 0));
}

}  // namespace

TEST_CASE("numeric: every bf16 pattern survives bf16 -> float -> bf16") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    auto bits = static_cast<uint16_t>(b);
    float f = bf16_to_float(bits);
    uint16_t back = float_to_bf16(f);
    if (bf16_is_nan(bits)) {
      REQUIRE(std::isnan(f));
      REQUIRE(bf16_is_nan(back));
      REQUIRE((back & 0x0040) != 0);  // quiet
      REQUIRE((back & 0x8000) == (bits & 0x8000));
    } else {
      REQUIRE(back == bits);
      REQUIRE(static_cast<uint32_t>(float_to_bits(f)) == (b << 16));
    }
  }
}

TEST_CASE("numeric: float -> bf16 rounds to nearest, ties to even") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(1.0f + 0x1.0p-8f) == 0x3f80);                   // tie, stays even
  CHECK(float_to_bf16(1.0f + 3 * 0x1.0p-8f) == 0x3f82);               // tie, rounds up to even
  CHECK(float_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f) == 0x3f81);      // just above the tie
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(bits_to_float(0x7f800001u)) == 0x7fc0);  // signalling NaN made quiet
  CHECK(float_to_bf16(bits_to_float(0xffc00000u)) == 0xffc0);
  CHECK(float_to_bf16(bits_to_float(0x00000001u)) == 0x0000);  // smallest subnormal -> 0

  uint64_t state = 42;
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t bits = next_random(state);
    float f = bits_to_float(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    auto low = static_cast<uint16_t>(bits >> 16);  // truncation: towards zero
    auto high = static_cast<uint16_t>(low + 1);    // next magnitude up, same sign
    double d_low = std::fabs(static_cast<double>(f) - bf16_value(low));
    double d_high = std::fabs(bf16_value(high) - static_cast<double>(f));
    uint16_t expected = d_low < d_high ? low : d_high < d_low ? high : (low % 2 == 0 ? low : high);
    REQUIRE_MESSAGE(float_to_bf16(f) == expected, "bits " << bits);
  }
}

TEST_CASE("numeric: e4m3 decoding") {
  CHECK(e4m3_to_float(0x00) == 0.0f);
  CHECK(std::signbit(e4m3_to_float(0x80)));
  CHECK(e4m3_to_float(0x38) == 1.0f);
  CHECK(e4m3_to_float(0x7e) == 448.0f);
  CHECK(e4m3_to_float(0xfe) == -448.0f);
  CHECK(e4m3_to_float(0x78) == 256.0f);
  CHECK(e4m3_to_float(0x77) == 240.0f);
  CHECK(e4m3_to_float(0x08) == 0x1.0p-6f);  // smallest normal
  CHECK(e4m3_to_float(0x01) == 0x1.0p-9f);  // smallest subnormal
  CHECK(e4m3_to_float(0x07) == 7 * 0x1.0p-9f);
  CHECK(std::isnan(e4m3_to_float(0x7f)));
  CHECK(std::isnan(e4m3_to_float(0xff)));
  // Finite codes increase strictly with the code: no gaps or overlaps between subnormals and
  // normals.
  for (int code = 1; code <= 0x7e; ++code)
    REQUIRE(e4m3_to_float(static_cast<uint8_t>(code)) >
            e4m3_to_float(static_cast<uint8_t>(code - 1)));
}

TEST_CASE("numeric: float -> e4m3 rounds to nearest even and saturates") {
  CHECK(float_to_e4m3(0.0f) == 0x00);
  CHECK(float_to_e4m3(-0.0f) == 0x80);
  CHECK(float_to_e4m3(1.0f) == 0x38);
  CHECK(float_to_e4m3(-1.0f) == 0xb8);
  CHECK(float_to_e4m3(1.0625f) == 0x38);  // tie between 1 and 1.125: even
  CHECK(float_to_e4m3(1.1875f) == 0x3a);  // tie between 1.125 and 1.25: even
  CHECK(float_to_e4m3(448.0f) == 0x7e);
  CHECK(float_to_e4m3(447.0f) == 0x7e);
  CHECK(float_to_e4m3(464.0f) == 0x7e);  // would round to 480: saturates
  CHECK(float_to_e4m3(1e9f) == 0x7e);
  CHECK(float_to_e4m3(-1e9f) == 0xfe);
  CHECK(float_to_e4m3(std::numeric_limits<float>::infinity()) == 0x7e);
  CHECK(float_to_e4m3(-std::numeric_limits<float>::infinity()) == 0xfe);
  CHECK((float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f) == 0x7f);
  CHECK(float_to_e4m3(0x1.0p-9f) == 0x01);
  CHECK(float_to_e4m3(0x1.0p-10f) == 0x00);              // tie between 0 and 2^-9: even
  CHECK(float_to_e4m3(3 * 0x1.0p-10f) == 0x02);          // tie between 1 and 2 (x 2^-9): even
  CHECK(float_to_e4m3(0x1.0p-6f - 0x1.0p-12f) == 0x08);  // rounds up into the normals
  CHECK(float_to_e4m3(1e-30f) == 0x00);

  // Every finite code round-trips.
  for (int code = 0; code < 256; ++code) {
    auto c = static_cast<uint8_t>(code);
    if ((c & 0x7f) == 0x7f) continue;
    REQUIRE(float_to_e4m3(e4m3_to_float(c)) == c);
  }

  // Random values across the whole range against a brute-force nearest search.
  uint64_t state = 7;
  for (int i = 0; i < 200'000; ++i) {
    float magnitude = std::ldexp(static_cast<float>(next_random(state)) * 0x1.0p-32f,
                                 static_cast<int>(next_random(state) % 22) - 12);
    float value = (next_random(state) & 1) ? -magnitude : magnitude;
    REQUIRE_MESSAGE(float_to_e4m3(value) == e4m3_brute_force(value), "value " << value);
  }
  // Exact midpoints of every adjacent pair of codes.
  for (int code = 0; code < 0x7e; ++code) {
    float mid = (e4m3_to_float(static_cast<uint8_t>(code)) +
                 e4m3_to_float(static_cast<uint8_t>(code + 1))) /
                2;
    REQUIRE(float_to_e4m3(mid) == (code % 2 == 0 ? code : code + 1));
  }
}
