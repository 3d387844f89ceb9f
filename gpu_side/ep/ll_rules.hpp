// The per-message and per-token rules of low-latency (LL) dispatch and combine (DEEPEP_CONTRACT
// 2.7, 2.8), written once for the CPU twins (integrations/low_latency/) and the CUDA kernels
// (gpu_side/cuda/ll_kernels.cu), so the two produce the same bytes:
//
// - ll_pack_message (sender): one bf16 token row becomes one message: a 16-byte header (int32
//   source token index, 12 zero bytes), the payload (FP8: DeepEP LL's cast, below; BF16: the
//   row's bytes), then the scale words, zero-padded to a multiple of 16 bytes.
// - ll_unpack_message (receiver): one message becomes row `row` of a local expert's outputs:
//   payload to recv_x, scale words to the column-major scale tensor, the header's token index to
//   src_info.
// - ll_combine_token (home rank): out[c] = bf16(sum over k ascending of w_k * float(row_k[c]))
//   in float32 from 0.0f, every product and sum rounded to float separately (no FMA, on host or
//   device: mul_rn / add_rn below), rounded to bf16 once.
//
// The FP8 cast, verified against deepseek-ai/DeepEP csrc/kernels/internode_ll.cu (dispatch's
// send phase) and csrc/kernels/utils.cuh (kFP8Margin, kFinfoAmaxE4M3, kFinfoAmaxInvE4M3,
// fast_log2_ceil, fast_pow2, calculate_fp8_scales, extract_required_scale_format):
//   per token per 128-channel group g:
//     amax      = max(float(1e-4), max over the group of |float(x)|)   (fmaxf/fabsf; order-free)
//     plain:      scale_inv = amax * (1.0f / 448.0f)   a multiply by the float reciprocal, not a
//                                                      division by 448
//                 scale     = 448.0f / amax            an IEEE division
//     round_scale: e = ceil(log2(amax * (1.0f / 448.0f))), read off the float's bits: exponent
//                 field - 127, plus 1 when any mantissa bit is set (so an exact power of two
//                 keeps its exponent); scale_inv = 2^e and scale = 2^-e, built from bits
//     payload   = e4m3(float(x) * scale), round to nearest even, saturating to +-448
//                 (__nv_cvt_float2_to_fp8x2(..., __NV_SATFINITE, __NV_E4M3))
//     scale word: float32 scale_inv; with ue8m0 the byte (bits(scale_inv) >> 23), i.e. the
//                 biased exponent (scale_inv > 0), four groups per int32, group g in byte g % 4
//                 of word g / 4 (DeepEP's receiver writes them as a uint8 view of the packed
//                 int32 tensor, so byte g % 4 is little-endian position g % 4).
// One deliberate difference from DeepEP's wire: DeepEP always sends H/128 float scales and takes
// the UE8M0 byte on the receiver; here the sender packs them, so a UE8M0 message carries H/512
// words (4 * H/512 bytes) and the receiver copies words. recv_x_scales are the same either way.
// Inputs must be finite (DeepEP assumes it too: with an infinite amax its power of two wraps).
//
// Accepted hidden sizes (ll_hidden_error): FP8 needs hidden % 512 == 0 (whole UE8M0 words;
// DeepEP's FP8 LL requires it too), BF16 hidden % 128 == 0. Payloads, scale areas and rows then
// start 16-byte aligned in a 16-byte-aligned message (message_bytes() is a multiple of 16; a
// UE8M0 message ends in up to 12 zero bytes, 8 for H = 7168), which the kernels' 16-byte
// accesses rely on.
//
// Who does the work is row_rules.hpp's `Lanes` policy (HostLanes on the host, the thread block's
// BlockLanes in the kernels): the cast's lanes stride over 128-channel groups (a group's amax
// is one lane's loop, so no cross-lane reduction is needed), unpack copies with copy_bytes and
// strides over scale words, combine strides over 8-channel (16-byte) chunks. Nothing here
// allocates or uses std:: containers.
#pragma once

#include "common/host_device.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/row_rules.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace proxyep::gpu_side::ep {

inline constexpr int kLlHeaderBytes = 16;  // per dispatch message: int32 source token index,
                                           // 12 bytes reserved (zero)
inline constexpr int kLlMaxTopk = 11;      // DeepEP LL's top-k limit
inline constexpr int kLlScaleGroup = 128;  // channels per FP8 scale
inline constexpr int kLlUe8m0PerWord = 4;  // UE8M0 scale bytes per 4-byte word
// DeepEP's kFP8Margin (a double literal narrowed to float) and 1 / kFinfoAmaxE4M3 in float.
inline constexpr float kLlAmaxFloor = static_cast<float>(1e-4);
inline constexpr float kLlInvE4m3Max = 1.0f / 448.0f;

struct LlFormat {
  uint32_t hidden = 0;
  bool fp8 = true, round_scale = false, ue8m0 = false;

  // Scale words per row: fp8 ? (ue8m0 ? H/512 : H/128) : 0 (4-byte words).
  PROXYEP_HOST_DEVICE uint32_t scale_words() const {
    if (!fp8) return 0;
    return ue8m0 ? hidden / (kLlScaleGroup * kLlUe8m0PerWord) : hidden / kLlScaleGroup;
  }
  // Payload bytes per row: fp8 ? H : 2H.
  PROXYEP_HOST_DEVICE uint32_t payload_bytes() const { return fp8 ? hidden : 2 * hidden; }
  // 16 + payload + 4 * scale_words, rounded up to 16.
  PROXYEP_HOST_DEVICE uint64_t message_bytes() const {
    const uint64_t raw = kLlHeaderBytes + uint64_t{payload_bytes()} + 4 * uint64_t{scale_words()};
    return (raw + 15) / 16 * 16;
  }
};

// nullptr when `f.hidden` suits the format, else why not (for the protocol's argument checks).
PROXYEP_HOST_DEVICE inline const char* ll_hidden_error(const LlFormat& f) {
  if (f.hidden == 0) return "low-latency mode needs hidden > 0";
  if (f.fp8 && f.hidden % (kLlScaleGroup * kLlUe8m0PerWord) != 0)
    return "FP8 low-latency dispatch needs hidden to be a multiple of 512";
  if (!f.fp8 && f.hidden % kLlScaleGroup != 0)
    return "BF16 low-latency dispatch needs hidden to be a multiple of 128";
  return nullptr;
}

// ll_hidden_error, plus DeepEP's "UE8M0 SF requires `round_scale=True`" (and FP8).
PROXYEP_HOST_DEVICE inline const char* ll_format_error(const LlFormat& f) {
  if (const char* why = ll_hidden_error(f)) return why;
  if (f.ue8m0 && !(f.fp8 && f.round_scale))
    return "use_ue8m0 needs use_fp8 and round_scale (as in DeepEP)";
  return nullptr;
}

namespace detail {

// Round-to-nearest float arithmetic that no compiler fuses into an FMA. On the device the
// intrinsics are never contracted. On the host a multiply feeding an add can only be contracted
// where the target has FMA (x86-64's baseline has none, so the loops stay vectorisable); there an
// empty asm makes the product opaque, so it is rounded to float first.
PROXYEP_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float p = a * b;
#if defined(__GNUC__) && defined(__x86_64__) && defined(__FMA__)
  asm("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(p));
#elif !defined(__x86_64__)
  volatile float opaque = p;
  p = opaque;
#endif
  return p;
#endif
}

PROXYEP_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

PROXYEP_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);  // IEEE even under --use_fast_math
#else
  return a / b;
#endif
}

// 4-byte words at 4-byte-aligned addresses in messages and scale areas.
PROXYEP_HOST_DEVICE inline void store_word(std::byte* to, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(to) = v;
#else
  std::memcpy(to, &v, sizeof v);
#endif
}

PROXYEP_HOST_DEVICE inline uint32_t load_word(const std::byte* from) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(from);
#else
  uint32_t v;
  std::memcpy(&v, from, sizeof v);
  return v;
#endif
}

// 16 payload bytes at a 16-byte-aligned address: one vector store on the device.
PROXYEP_HOST_DEVICE inline void store_16(std::byte* to, const uint8_t (&v)[16]) {
#if defined(__CUDA_ARCH__)
  uint32_t w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<uint32_t>(v[4 * i]) | (static_cast<uint32_t>(v[4 * i + 1]) << 8) |
           (static_cast<uint32_t>(v[4 * i + 2]) << 16) |
           (static_cast<uint32_t>(v[4 * i + 3]) << 24);
  *reinterpret_cast<uint4*>(to) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  std::memcpy(to, v, sizeof v);
#endif
}

}  // namespace detail

// One 128-channel group's multipliers: payload = e4m3(x * scale); scale_inv is what is stored.
struct LlGroupScale {
  float scale = 0.0f;
  float scale_inv = 0.0f;
};

// DeepEP's calculate_fp8_scales for a group whose amax (already floored at kLlAmaxFloor) is
// `amax`.
PROXYEP_HOST_DEVICE inline LlGroupScale ll_group_scale(float amax, bool round_scale) {
  LlGroupScale s;
  const float ratio = detail::mul_rn(amax, kLlInvE4m3Max);
  if (round_scale) {
    // ceil(log2(ratio)) from the bits; ratio >= 1e-4 / 448 is normal and finite inputs keep it
    // below 2^127, so both powers of two are normal floats.
    const uint32_t bits = float_to_bits(ratio);
    const int e = static_cast<int>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
    s.scale_inv = bits_to_float(static_cast<uint32_t>(e + 127) << 23);
    s.scale = bits_to_float(static_cast<uint32_t>(127 - e) << 23);
  } else {
    s.scale_inv = ratio;
    s.scale = detail::div_rn(kFp8E4m3Max, amax);
  }
  return s;
}

// The UE8M0 byte of a (power-of-two) scale_inv: its biased exponent.
PROXYEP_HOST_DEVICE inline uint8_t ll_ue8m0_byte(float scale_inv) {
  return static_cast<uint8_t>(float_to_bits(scale_inv) >> 23);
}

// Casts group `g` of row `x` into the message's payload and scale area (FP8 only).
PROXYEP_HOST_DEVICE inline void ll_cast_group(const LlFormat& f, const uint16_t* x, uint32_t g,
                                              std::byte* payload, std::byte* scales) {
  const uint16_t* in = x + static_cast<uint64_t>(g) * kLlScaleGroup;
  float amax = kLlAmaxFloor;
  for (int c = 0; c < kLlScaleGroup; c += kCombineChunk) {
    uint16_t v[kCombineChunk];
    detail::load_chunk(in + c, v);
    for (int j = 0; j < kCombineChunk; ++j) {
      const float a = bf16_to_float(static_cast<uint16_t>(v[j] & 0x7fffu));  // |x|
      amax = a > amax ? a : amax;
    }
  }
  const LlGroupScale s = ll_group_scale(amax, f.round_scale);
  std::byte* out = payload + static_cast<uint64_t>(g) * kLlScaleGroup;
  for (int c = 0; c < kLlScaleGroup; c += 16) {
    uint16_t lo[kCombineChunk], hi[kCombineChunk];
    detail::load_chunk(in + c, lo);
    detail::load_chunk(in + c + kCombineChunk, hi);
    uint8_t codes[16];
    for (int j = 0; j < kCombineChunk; ++j) {
      codes[j] = float_to_e4m3(detail::mul_rn(bf16_to_float(lo[j]), s.scale));
      codes[kCombineChunk + j] = float_to_e4m3(detail::mul_rn(bf16_to_float(hi[j]), s.scale));
    }
    detail::store_16(out + c, codes);
  }
  if (f.ue8m0)
    scales[g] = static_cast<std::byte>(ll_ue8m0_byte(s.scale_inv));  // byte g % 4 of word g / 4
  else
    detail::store_word(scales + 4 * static_cast<uint64_t>(g), float_to_bits(s.scale_inv));
}

// Dispatch, sender: token row x (bf16 [H]) whose index at the source is `token` becomes
// `message` (f.message_bytes() bytes, 16-byte aligned for the kernels). Every lane of `lanes`
// calls it with the same arguments; together they write every byte of the message once.
template <class Lanes>
PROXYEP_HOST_DEVICE inline void ll_pack_message(const LlFormat& f, const uint16_t* x, int32_t token,
                                                std::byte* message, const Lanes& lanes) {
  const uint32_t lane = lanes.lane(), lanes_n = lanes.count();
  std::byte* payload = message + kLlHeaderBytes;
  std::byte* scales = payload + f.payload_bytes();
  if (lane == 0) {
    detail::store_word(message, static_cast<uint32_t>(token));
    for (int i = 4; i < kLlHeaderBytes; i += 4)
      detail::store_word(message + i, 0);
    // Padding after the scale words (none for accepted hidden sizes).
    const uint64_t used =
        kLlHeaderBytes + uint64_t{f.payload_bytes()} + 4 * uint64_t{f.scale_words()};
    for (uint64_t i = used; i < f.message_bytes(); ++i)
      message[i] = std::byte{0};
  }
  if (!f.fp8) {
    lanes.copy_bytes(payload, reinterpret_cast<const std::byte*>(x), f.payload_bytes());
    return;
  }
  for (uint32_t g = lane; g < f.hidden / kLlScaleGroup; g += lanes_n)
    ll_cast_group(f, x, g, payload, scales);
}

// Dispatch, receiver: one message becomes row `row` of one local expert's outputs.
struct LlExpertSink {
  std::byte* x = nullptr;  // the expert's recv_x rows: row r at x + r * payload_bytes()
  uint32_t* scales =
      nullptr;               // column-major: scale word w of row r at scales[w * scale_stride + r]
  int64_t scale_stride = 0;  // = R*T (rows per expert)
  int32_t* src_info = nullptr;  // src_info[r] = the header's token index
};

// Every lane of `lanes` calls it with the same arguments; together they write the row once.
template <class Lanes>
PROXYEP_HOST_DEVICE inline void ll_unpack_message(const LlFormat& f, const std::byte* message,
                                                  const LlExpertSink& sink, int64_t row,
                                                  const Lanes& lanes) {
  const uint32_t lane = lanes.lane(), lanes_n = lanes.count();
  const uint64_t payload_bytes = f.payload_bytes();
  lanes.copy_bytes(sink.x + static_cast<uint64_t>(row) * payload_bytes, message + kLlHeaderBytes,
                   payload_bytes);
  const std::byte* words = message + kLlHeaderBytes + payload_bytes;
  for (uint32_t w = lane; w < f.scale_words(); w += lanes_n)
    sink.scales[static_cast<int64_t>(w) * sink.scale_stride + row] =
        detail::load_word(words + 4 * static_cast<uint64_t>(w));
  if (lane == 0) sink.src_info[row] = static_cast<int32_t>(detail::load_word(message));
}

// Combine, home rank: out[c] = bf16( sum over k ascending with rows[k] != nullptr of
// weights[k] * float(rows[k][c]) ), in float32 from 0.0f, each product rounded to float, then
// added, rounded to bf16 once. hidden is a multiple of kCombineChunk (8); rows and out are
// 16-byte aligned for the kernels. Lanes stride over 8-channel chunks; every lane calls it with
// the same arguments.
template <class Lanes>
PROXYEP_HOST_DEVICE inline void ll_combine_token(const uint16_t* const* rows, const float* weights,
                                                 int topk, uint32_t hidden, uint16_t* out,
                                                 const Lanes& lanes) {
  const uint64_t lane = lanes.lane(), lanes_n = lanes.count();
  for (uint64_t c0 = lane * kCombineChunk; c0 < hidden; c0 += lanes_n * kCombineChunk) {
    float acc[kCombineChunk];
    for (int j = 0; j < kCombineChunk; ++j)
      acc[j] = 0.0f;
    for (int k = 0; k < topk; ++k) {
      const uint16_t* row = rows[k];
      if (row == nullptr) continue;
      const float w = weights[k];
      uint16_t v[kCombineChunk];
      detail::load_chunk(row + c0, v);
      for (int j = 0; j < kCombineChunk; ++j)
        acc[j] = detail::add_rn(acc[j], detail::mul_rn(w, bf16_to_float(v[j])));
    }
    uint16_t v[kCombineChunk];
    for (int j = 0; j < kCombineChunk; ++j)
      v[j] = float_to_bf16(acc[j]);
    detail::store_chunk(out + c0, v);
  }
}

}  // namespace proxyep::gpu_side::ep
