// The two narrow formats EP moves, as plain bit patterns (uint16_t bf16, uint8_t e4m3) so host
// code, the CPU twins and CUDA kernels share one definition without CUDA's types:
// - bf16: the upper half of an IEEE float32. float -> bf16 rounds to nearest, ties to even (what
//   PyTorch's .to(torch.bfloat16) and __float2bfloat16_rn do); NaN stays NaN, made quiet.
// - float8_e4m3fn (DEEPEP_CONTRACT 2.7): sign, 4 exponent bits (bias 7), 3 mantissa bits, no
//   infinities, NaN = S.1111.111, largest finite 448, subnormals down to 2^-9. float -> e4m3
//   rounds to nearest even and saturates to +-448 (also for +-inf), like CUDA's
//   __NV_SATFINITE conversion; DeepEP's casts scale values into [-448, 448] first, so saturation
//   only ever absorbs rounding at the top.
#pragma once

#include "common/host_device.hpp"

#include <cstdint>
#include <cstring>

namespace proxyep::gpu_side::ep {

inline constexpr float kFp8E4m3Max = 448.0f;

PROXYEP_HOST_DEVICE inline uint32_t float_to_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

PROXYEP_HOST_DEVICE inline float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

PROXYEP_HOST_DEVICE inline float bf16_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

PROXYEP_HOST_DEVICE inline uint16_t float_to_bf16(float value) {
  uint32_t bits = float_to_bits(value);
  // Adding 0x7fff plus the kept LSB rounds ties to even; a carry out of the mantissa bumps the
  // exponent, which is the correct rounding (up to infinity past the largest finite bf16).
  uint32_t lsb = (bits >> 16) & 1u;
  auto rounded = static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
  // NaN: keep sign and payload top, set the quiet bit. Both results are computed and one is
  // selected (no branch), so loops over rows vectorise.
  auto quiet_nan = static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

PROXYEP_HOST_DEVICE inline float e4m3_to_float(uint8_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  uint32_t exponent = (bits >> 3) & 0xfu;
  uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return bits_to_float(sign | 0x7fc00000u);
  if (exponent == 0) {  // subnormal: mantissa * 2^-9 (exact in float)
    float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
    return bits_to_float(sign | float_to_bits(magnitude));
  }
  return bits_to_float(sign | ((exponent - 7 + 127) << 23) | (mantissa << 20));
}

PROXYEP_HOST_DEVICE inline uint8_t float_to_e4m3(float value) {
  uint32_t bits = float_to_bits(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t magnitude_bits = bits & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  float magnitude = bits_to_float(magnitude_bits);
  if (magnitude >= kFp8E4m3Max) return static_cast<uint8_t>(sign | 0x7eu);  // saturate (+inf too)
  constexpr float kMinNormal = 1.0f / 64.0f;                                // 2^-6
  if (magnitude < kMinNormal) {
    // Subnormal (or zero): the code is round(magnitude / 2^-9), an integer in [0, 8]; 8 is the
    // smallest normal's code, so rounding up across the boundary needs no special case.
    // magnitude * 512 and its fractional part are exact in float.
    float scaled = magnitude * 512.0f;
    uint32_t whole = static_cast<uint32_t>(scaled);
    float fraction = scaled - static_cast<float>(whole);
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u))) ++whole;
    return static_cast<uint8_t>(sign | whole);
  }
  // Normal: rebias the exponent (float 127 -> e4m3 7) keeping the 23-bit mantissa below it, then
  // drop 20 mantissa bits with ties to even; a carry rolls into the exponent as it should. The
  // result cannot pass 0x7e because magnitude < 448 rounds to at most 448.
  uint32_t rebased = magnitude_bits - ((127u - 7u) << 23);
  uint32_t lsb = (rebased >> 20) & 1u;
  uint32_t code = (rebased + 0x7ffffu + lsb) >> 20;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace proxyep::gpu_side::ep
