// The low-latency rules (gpu_side/ep/ll_rules.hpp) against the separately written reference
// (gpu_side/ep/ll_reference.hpp) and against values worked out by hand:
// - ll_pack_message's FP8 cast equals ll_cast_reference bit for bit, on random data of many
//   magnitudes and on edge groups (all zero: the amax floor; bf16's largest values; negative;
//   amax an exact power of two times 448, where round_scale's ceiling must not round up), for
//   plain, round_scale and UE8M0 scales; a few codes and scale bytes are checked by hand;
// - pack then unpack lands payload, column-major scale words and src_info where they belong;
// - DeepEP's own tolerance: the dequantised payload (code * scale_inv) matches x with
//   calc_diff < 9e-4;
// - check_ll_dispatch accepts a correct simulated dispatch (shuffled rows, blocks in random
//   order) and rejects each of: a corrupted payload byte, a wrong scale word, a wrong
//   recv_count, overlapping blocks, a wrong block count, a foreign token in src_info, a
//   duplicated token;
// - ll_combine_token equals reference_ll_combine, and on a hand-worked case shows the products
//   are rounded before they are added (an FMA gives other bits).
#include "gpu_side/ep/ll_reference.hpp"
#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/numeric.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace proxyep::gpu_side::ep;

namespace {

LlFormat make_format(uint32_t hidden, bool fp8, bool round_scale = false, bool ue8m0 = false) {
  LlFormat f;
  f.hidden = hidden;
  f.fp8 = fp8;
  f.round_scale = round_scale;
  f.ue8m0 = ue8m0;
  return f;
}

// Every format DeepEP's LL dispatch allows.
std::vector<LlFormat> all_formats(uint32_t hidden) {
  return {make_format(hidden, true), make_format(hidden, true, true),
          make_format(hidden, true, true, true), make_format(hidden, false)};
}

// bf16 values of random sign whose magnitudes span 2^-20..2^20 from group to group (and a
// little within a group).
std::vector<uint16_t> random_row(std::mt19937_64& rng, uint32_t hidden) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<uint16_t> row(hidden);
  for (uint32_t g = 0; g < hidden / 128; ++g) {
    const int e = exponent(rng);
    for (uint32_t c = g * 128; c < (g + 1) * 128; ++c)
      row[c] = float_to_bf16(std::ldexp(normal(rng), e));
  }
  return row;
}

// Edge groups, one per 128 channels in turn (hidden a multiple of 1024 shows them all).
std::vector<uint16_t> edge_row(std::mt19937_64& rng, uint32_t hidden) {
  std::vector<uint16_t> row = random_row(rng, hidden);
  for (uint32_t g = 0; g < hidden / 128; ++g) {
    uint16_t* group = row.data() + g * 128;
    switch (g % 8) {
      case 0:
        std::fill_n(group, 128, uint16_t{0});
        break;  // amax floored at 1e-4
      case 1:
        std::fill_n(group, 128, uint16_t{0x8000});
        break;  // -0
      case 2:   // bf16's largest finite
        for (int c = 0; c < 128; ++c)
          group[c] = c % 3 == 0 ? 0x7f7f : (c % 3 == 1 ? 0xff7f : 0x7f00);
        break;
      case 3:  // amax = 448 * 2^4: ratio exactly 16 before the reciprocal's rounding
        group[5] = float_to_bf16(-448.0f * 16.0f);
        break;
      case 4:  // all negative
        for (int c = 0; c < 128; ++c)
          group[c] = static_cast<uint16_t>(group[c] | 0x8000u);
        break;
      case 5:  // tiny values below the floor: amax = 1e-4, codes stay small
        for (int c = 0; c < 128; ++c)
          group[c] = float_to_bf16(std::ldexp(static_cast<float>(c % 7) - 3.0f, -20));
        break;
      case 6:  // one outlier: the rest round to e4m3 subnormals or zero
        group[77] = float_to_bf16(3.0e4f);
        break;
      default:
        break;  // random
    }
  }
  return row;
}

struct Packed {
  std::vector<std::byte> message;
  std::vector<uint8_t> payload;  // reference
  std::vector<uint32_t> words;   // reference
};

Packed pack_both(const LlFormat& f, const std::vector<uint16_t>& x, int32_t token) {
  Packed p;
  p.message.assign(f.message_bytes(), std::byte{0xee});  // poison: every byte is written
  ll_pack_message(f, x.data(), token, p.message.data(), HostLanes{});
  p.payload.assign(f.payload_bytes(), 0xcd);
  p.words.assign(f.scale_words(), 0xcdcdcdcdu);
  ll_cast_reference(f, x.data(), p.payload.data(), p.words.data());
  return p;
}

void check_same_as_reference(const LlFormat& f, const std::vector<uint16_t>& x, int32_t token) {
  CAPTURE(f.fp8);
  CAPTURE(f.round_scale);
  CAPTURE(f.ue8m0);
  const Packed p = pack_both(f, x, token);
  int32_t header = 0;
  std::memcpy(&header, p.message.data(), 4);
  CHECK(header == token);
  for (int i = 4; i < kLlHeaderBytes; ++i)
    CHECK(p.message[i] == std::byte{0});
  const std::byte* payload = p.message.data() + kLlHeaderBytes;
  for (uint32_t i = 0; i < f.payload_bytes(); ++i) {
    if (static_cast<uint8_t>(payload[i]) == p.payload[i]) continue;
    FAIL_CHECK("payload byte " << i << ": rules " << int(static_cast<uint8_t>(payload[i]))
                               << ", reference " << int(p.payload[i]) << ", x bits "
                               << (f.fp8 ? x[i] : 0));
    break;
  }
  for (uint32_t w = 0; w < f.scale_words(); ++w) {
    uint32_t got = 0;
    std::memcpy(&got, payload + f.payload_bytes() + 4 * w, 4);
    CHECK_MESSAGE(got == p.words[w], "scale word " << w);
  }
}

// DeepEP's calc_diff: 1 - 2 sum(xy) / sum(x^2 + y^2), in double.
double calc_diff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    norm += x[i] * x[i] + y[i] * y[i];
  }
  return 1.0 - 2.0 * xy / norm;
}

float scale_inv_of(const LlFormat& f, const uint32_t* words, uint32_t g) {
  if (!f.ue8m0) return bits_to_float(words[g]);
  const uint32_t byte = (words[g / 4] >> (8 * (g % 4))) & 0xffu;
  return std::ldexp(1.0f, static_cast<int>(byte) - 127);
}

}  // namespace

TEST_CASE("LlFormat: sizes and the hidden sizes each format accepts") {
  const LlFormat fp8 = make_format(7168, true), ue8m0 = make_format(7168, true, true, true);
  const LlFormat bf16 = make_format(7168, false);
  CHECK(fp8.scale_words() == 56);
  CHECK(fp8.payload_bytes() == 7168);
  CHECK(fp8.message_bytes() == 16 + 7168 + 4 * 56);  // DEEPEP_CONTRACT 4.3's H + H/128*4 + 16
  CHECK(ue8m0.scale_words() == 14);
  CHECK(ue8m0.message_bytes() == 7248);  // 16 + 7168 + 4 * 14 = 7240, rounded up to 16
  CHECK(bf16.scale_words() == 0);
  CHECK(bf16.payload_bytes() == 2 * 7168);
  CHECK(bf16.message_bytes() == 16 + 2 * 7168);
  CHECK(make_format(640, true).message_bytes() % 16 == 0);  // rounded up (hidden not accepted)

  for (uint32_t h : {2048u, 2560u, 4096u, 5120u, 6144u, 7168u, 8192u, 3072u, 512u}) {
    CAPTURE(h);
    for (const LlFormat& f : all_formats(h))
      CHECK(ll_format_error(f) == nullptr);
  }
  CHECK(ll_hidden_error(make_format(0, false)) != nullptr);
  CHECK(ll_hidden_error(make_format(640, true)) != nullptr);  // 5 groups: no whole UE8M0 word
  CHECK(ll_hidden_error(make_format(640, false)) == nullptr);
  CHECK(ll_hidden_error(make_format(200, false)) != nullptr);
  CHECK(ll_format_error(make_format(7168, true, false, true)) != nullptr);  // UE8M0 w/o rounding
}

TEST_CASE("ll_pack_message: values worked out by hand") {
  const uint32_t hidden = 512;
  std::vector<uint16_t> x(hidden, 0);  // groups 1..3 all zero
  x[0] = float_to_bf16(1.0f);          // group 0: amax 1, scale 448
  x[1] = float_to_bf16(-0.5f);
  x[2] = float_to_bf16(1.0f / 1024.0f);
  for (const LlFormat& f : {make_format(hidden, true), make_format(hidden, true, true, true)}) {
    CAPTURE(f.ue8m0);
    std::vector<std::byte> m(f.message_bytes());
    ll_pack_message(f, x.data(), 41, m.data(), HostLanes{});
    const auto* code = reinterpret_cast<const uint8_t*>(m.data() + kLlHeaderBytes);
    if (!f.round_scale) {
      CHECK(code[0] == 0x7e);  // 1 * 448 = 448: the largest e4m3
      CHECK(code[1] == 0xf6);  // -224 = -1.75 * 2^7: sign, exponent 14, mantissa 6
      CHECK(code[2] == 0x2e);  // 448/1024 = 0.4375 = 1.75 * 2^-2: exponent 5, mantissa 6
      uint32_t word = 0;
      std::memcpy(&word, code + hidden, 4);
      CHECK(word == float_to_bits(1.0f * (1.0f / 448.0f)));
    } else {
      // ratio 1/448 rounds up to 2^-8: scale 256, 1 -> 256 = 2^8 (0x78), -0.5 -> -128 (0xf0).
      CHECK(code[0] == 0x78);
      CHECK(code[1] == 0xf0);
      uint32_t word = 0;
      std::memcpy(&word, code + hidden, 4);
      // Group 0: 2^-8 -> biased exponent 119. Zero groups: 1e-4 / 448 = 2.23e-7 lies in
      // (2^-23, 2^-22], so 2^-22 -> 105.
      CHECK(word == (119u | 105u << 8 | 105u << 16 | 105u << 24));
    }
    for (uint32_t c = 128; c < hidden; ++c)
      CHECK(code[c] == 0);
  }
}

TEST_CASE("ll_pack_message equals ll_cast_reference: random and edge rows, every format") {
  std::mt19937_64 rng(20250611);
  for (uint32_t hidden : {512u, 1024u, 7168u}) {
    CAPTURE(hidden);
    for (int i = 0; i < 6; ++i) {
      const std::vector<uint16_t> x = i % 2 == 0 ? random_row(rng, hidden) : edge_row(rng, hidden);
      for (const LlFormat& f : all_formats(hidden))
        check_same_as_reference(f, x, 1000 + i);
    }
  }
}

TEST_CASE("ll_pack_message: dequantised FP8 matches x within DeepEP's tolerance") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  const uint32_t hidden = 7168;
  for (const LlFormat& f : all_formats(hidden)) {
    if (!f.fp8) continue;
    CAPTURE(f.round_scale);
    CAPTURE(f.ue8m0);
    std::vector<double> want, got;
    for (int t = 0; t < 8; ++t) {
      std::vector<uint16_t> x(hidden);
      for (uint16_t& v : x)
        v = float_to_bf16(normal(rng) * static_cast<float>(t + 1));
      const Packed p = pack_both(f, x, t);
      const auto* code = reinterpret_cast<const uint8_t*>(p.message.data() + kLlHeaderBytes);
      const auto* words = reinterpret_cast<const uint32_t*>(code + hidden);
      for (uint32_t c = 0; c < hidden; ++c) {
        want.push_back(bf16_to_float(x[c]));
        got.push_back(double{e4m3_to_float(code[c])} * scale_inv_of(f, words, c / 128));
      }
    }
    const double diff = calc_diff(want, got);
    CHECK(diff < 9e-4);  // test_low_latency.py's FP8 bound
    CHECK(diff > 0);     // it is a lossy cast
  }
}

TEST_CASE("ll_unpack_message: pack then unpack puts every part in its place") {
  std::mt19937_64 rng(3);
  const uint32_t hidden = 1024;
  const int64_t rows = 12;  // R * T of the expert
  for (const LlFormat& f : all_formats(hidden)) {
    CAPTURE(f.fp8);
    CAPTURE(f.ue8m0);
    const uint32_t S = f.scale_words();
    std::vector<std::byte> recv_x(rows * f.payload_bytes(), std::byte{0x11});
    std::vector<uint32_t> scales(S * rows, 0x22222222u);
    std::vector<int32_t> src_info(rows, -7);
    const LlExpertSink sink{recv_x.data(), scales.data(), rows, src_info.data()};
    const int64_t filled[] = {5, 0, 11};
    std::vector<Packed> sent;
    for (int64_t row : filled) {
      const std::vector<uint16_t> x = random_row(rng, hidden);
      sent.push_back(pack_both(f, x, static_cast<int32_t>(100 + row)));
      ll_unpack_message(f, sent.back().message.data(), sink, row, HostLanes{});
    }
    for (size_t i = 0; i < sent.size(); ++i) {
      const int64_t row = filled[i];
      CAPTURE(row);
      CHECK(src_info[row] == 100 + row);
      CHECK(std::memcmp(recv_x.data() + row * f.payload_bytes(), sent[i].payload.data(),
                        f.payload_bytes()) == 0);
      for (uint32_t w = 0; w < S; ++w)
        CHECK(scales[w * rows + row] == sent[i].words[w]);  // column-major
    }
    // Untouched rows keep their filler.
    CHECK(src_info[1] == -7);
    CHECK(recv_x[1 * f.payload_bytes()] == std::byte{0x11});
    if (S > 0) CHECK(scales[1] == 0x22222222u);
  }
}

namespace {

// Every rank's inputs and one rank's LL dispatch outputs, produced by simulating DeepEP's
// receive side with the rules: per local expert, sources in random order each get a block, rows
// inside a block in random order.
struct LlWorld {
  EpShape shape{4, 4, 16};
  int64_t T = 24;
  int K = 5;
  LlFormat format;
  int rank = 2;
  std::vector<Tensor> x, topk_idx;
  std::vector<LlRankInputs> inputs;
  Tensor recv_x, recv_x_scales, recv_count, src_info, layout_range;

  LlDispatchOutputs outputs() const {
    return {recv_x, format.fp8 ? recv_x_scales.ref() : TensorRef{}, recv_count, src_info,
            layout_range};
  }
};

LlWorld make_ll_world(const LlFormat& format, uint64_t seed) {
  LlWorld w;
  w.format = format;
  std::mt19937_64 rng(seed);
  const int R = w.shape.num_ranks, E = w.shape.num_experts;
  for (int s = 0; s < R; ++s) {
    const int64_t n = s == 1 ? 0 : w.T - s;  // rank 1 sends nothing
    Tensor x = Tensor::empty(DType::bf16, n, format.hidden);
    Tensor idx = Tensor::empty(DType::i64, n, w.K);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<uint16_t> row = random_row(rng, format.hidden);
      std::copy(row.begin(), row.end(), x.data<uint16_t>() + t * format.hidden);
      std::vector<int64_t> experts(E);
      for (int e = 0; e < E; ++e)
        experts[e] = e;
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int k = 0; k < w.K; ++k)
        idx.data<int64_t>()[t * w.K + k] = rng() % 8 == 0 ? -1 : experts[k];
    }
    w.x.push_back(x);
    w.topk_idx.push_back(idx);
  }
  for (int s = 0; s < R; ++s)
    w.inputs.push_back({w.x[s], w.topk_idx[s], {}});

  const int64_t local = w.shape.experts_per_rank(), rows = R * w.T;
  const uint32_t S = format.scale_words();
  w.recv_x = Tensor::zeros(format.fp8 ? DType::fp8_e4m3 : DType::bf16, local * rows, format.hidden);
  w.recv_x_scales =
      Tensor::zeros(format.ue8m0 ? DType::i32 : DType::f32, local * std::max(S, 1u), rows);
  w.recv_count = Tensor::zeros(DType::i32, local);
  w.src_info = Tensor::zeros(DType::i32, local, rows);
  w.layout_range = Tensor::zeros(DType::i64, local, R);
  std::vector<std::byte> message(format.message_bytes());
  for (int64_t e = 0; e < local; ++e) {
    const int64_t global = w.rank * local + e;
    const LlExpertSink sink{w.recv_x.raw() + e * rows * format.payload_bytes(),
                            w.recv_x_scales.data<uint32_t>() + e * S * rows, rows,
                            w.src_info.data<int32_t>() + e * rows};
    std::vector<int> order(R);
    for (int s = 0; s < R; ++s)
      order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    int64_t next = 0;
    for (int s : order) {
      std::vector<int64_t> tokens;
      for (int64_t t = 0; t < w.topk_idx[s].rows(); ++t)
        for (int k = 0; k < w.K; ++k)
          if (w.topk_idx[s].data<int64_t>()[t * w.K + k] == global) tokens.push_back(t);
      std::shuffle(tokens.begin(), tokens.end(), rng);
      for (size_t i = 0; i < tokens.size(); ++i) {
        ll_pack_message(format, w.x[s].data<uint16_t>() + tokens[i] * format.hidden,
                        static_cast<int32_t>(tokens[i]), message.data(), HostLanes{});
        ll_unpack_message(format, message.data(), sink, next + static_cast<int64_t>(i),
                          HostLanes{});
      }
      w.layout_range.data<int64_t>()[e * R + s] =
          static_cast<int64_t>(static_cast<uint64_t>(next) << 32 | tokens.size());
      next += static_cast<int64_t>(tokens.size());
    }
    w.recv_count.data<int32_t>()[e] = static_cast<int32_t>(next);
  }
  return w;
}

std::string check(const LlWorld& w) {
  return check_ll_dispatch(w.inputs, w.shape, w.T, w.format, w.rank, w.outputs());
}

// The first row of local expert `e` that came from a source with at least 2 rows.
int64_t block_with_two_rows(const LlWorld& w, int64_t e, int* source) {
  for (int s = 0; s < w.shape.num_ranks; ++s) {
    const auto packed =
        static_cast<uint64_t>(w.layout_range.data<int64_t>()[e * w.shape.num_ranks + s]);
    if ((packed & 0xffffffffu) >= 2) {
      *source = s;
      return static_cast<int64_t>(packed >> 32);
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("check_ll_dispatch: accepts a correct dispatch and rejects every kind of corruption") {
  for (const LlFormat& f : all_formats(512)) {
    CAPTURE(f.fp8);
    CAPTURE(f.round_scale);
    CAPTURE(f.ue8m0);
    const LlWorld good = make_ll_world(f, 99);
    REQUIRE(check(good) == "");
    const int64_t rows = good.shape.num_ranks * good.T;
    const int64_t e = 1;
    int source = -1;
    const int64_t begin = block_with_two_rows(good, e, &source);
    REQUIRE(begin >= 0);
    const auto mutated = [&](auto&& change) {
      LlWorld w = good;
      w.recv_x = good.recv_x.clone();
      w.recv_x_scales = good.recv_x_scales.clone();
      w.recv_count = good.recv_count.clone();
      w.src_info = good.src_info.clone();
      w.layout_range = good.layout_range.clone();
      change(w);
      return check(w);
    };
    SUBCASE("a corrupted payload byte") {
      const std::string why = mutated([&](LlWorld& w) {
        w.recv_x.raw()[(e * rows + begin + 1) * f.payload_bytes() + 77] ^= std::byte{0x01};
      });
      CHECK(why.find("payload differs") != std::string::npos);
    }
    if (f.fp8) {
      SUBCASE("a wrong scale word") {
        const std::string why = mutated([&](LlWorld& w) {
          w.recv_x_scales.data<uint32_t>()[(e * f.scale_words() + 0) * rows + begin] ^= 1u << 8;
        });
        CHECK(why.find("scale word") != std::string::npos);
      }
    }
    SUBCASE("a wrong recv_count") {
      const std::string why = mutated([&](LlWorld& w) { ++w.recv_count.data<int32_t>()[e]; });
      CHECK(why.find("recv_count") != std::string::npos);
    }
    SUBCASE("overlapping blocks (the counts stay right)") {
      const std::string why = mutated([&](LlWorld& w) {
        // Move every non-empty block that does not start at 0 one row down.
        for (int s = 0; s < w.shape.num_ranks; ++s) {
          auto& packed = w.layout_range.data<int64_t>()[e * w.shape.num_ranks + s];
          if ((packed & 0xffffffff) != 0 && (packed >> 32) != 0) packed -= int64_t{1} << 32;
        }
      });
      CHECK(!why.empty());
    }
    SUBCASE("a wrong block count") {
      const std::string why = mutated(
          [&](LlWorld& w) { --w.layout_range.data<int64_t>()[e * w.shape.num_ranks + source]; });
      CHECK(why.find("layout_range count") != std::string::npos);
    }
    SUBCASE("a token that did not choose the expert") {
      const std::string why = mutated([&](LlWorld& w) {
        int32_t& token = w.src_info.data<int32_t>()[e * rows + begin];
        const int64_t global = w.rank * w.shape.experts_per_rank() + e;
        for (int32_t t = 0; t < w.topk_idx[source].rows(); ++t) {
          const int64_t* idx = w.topk_idx[source].data<int64_t>() + t * w.K;
          if (std::find(idx, idx + w.K, global) == idx + w.K) {
            token = t;
            break;
          }
        }
      });
      CHECK(why.find("src_info") != std::string::npos);
    }
    SUBCASE("a token twice in its block") {
      const std::string why = mutated([&](LlWorld& w) {
        int32_t* info = w.src_info.data<int32_t>() + e * rows + begin;
        info[1] = info[0];
      });
      CHECK(!why.empty());
    }
  }
}

TEST_CASE("check_ll_dispatch: malformed outputs are reported, not read out of bounds") {
  LlWorld w = make_ll_world(make_format(512, true), 5);
  w.src_info = Tensor::zeros(DType::i32, 2, 3);
  CHECK(check(w).find("src_info") != std::string::npos);
  w = make_ll_world(make_format(512, true), 5);
  w.recv_x_scales = Tensor();
  CHECK(check(w).find("recv_x_scales") != std::string::npos);
}

TEST_CASE("ll_combine_token equals reference_ll_combine") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  const int home = 1;
  for (uint32_t hidden : {128u, 7168u}) {
    for (int topk : {1, 8, kLlMaxTopk}) {
      CAPTURE(hidden);
      CAPTURE(topk);
      const int64_t tokens = 9, experts = 32;
      Tensor idx = Tensor::empty(DType::i64, tokens, topk);
      Tensor weights = Tensor::empty(DType::f32, tokens, topk);
      for (int64_t i = 0; i < tokens * topk; ++i) {
        idx.data<int64_t>()[i] = rng() % 6 == 0 ? -1 : static_cast<int64_t>(rng() % experts);
        weights.data<float>()[i] = std::fabs(normal(rng));
      }
      // Expert outputs per (expert, token); expert 3 is "masked" (no row).
      std::vector<uint16_t> outputs(experts * tokens * hidden);
      for (uint16_t& v : outputs)
        v = float_to_bf16(normal(rng) * 3.0f);
      const LlExpertRow expert_row = [&](int64_t expert, int rank, int64_t token) {
        CHECK(rank == home);
        return expert == 3 ? nullptr : outputs.data() + (expert * tokens + token) * hidden;
      };
      const Tensor want = reference_ll_combine(idx, weights, hidden, home, expert_row);
      std::vector<uint16_t> got(tokens * hidden);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<const uint16_t*> rows(topk);
        for (int k = 0; k < topk; ++k) {
          const int64_t expert = idx.data<int64_t>()[t * topk + k];
          rows[k] = expert < 0 ? nullptr : expert_row(expert, home, t);
        }
        ll_combine_token(rows.data(), weights.data<float>() + t * topk, topk, hidden,
                         got.data() + t * hidden, HostLanes{});
      }
      CHECK(std::memcmp(got.data(), want.data<uint16_t>(), got.size() * 2) == 0);
    }
  }
}

TEST_CASE("ll_combine_token: products are rounded to float before they are added") {
  // v = 1 + 2^-7 (exact in bf16). k=0: -1 * v; k=1: (1 + 2^-23) * v = 1 + 2^-7 + 2^-23 + 2^-30,
  // rounded to 1 + 2^-7 + 2^-23. Sum: 2^-23 (bf16 0x3400). An FMA for k=1 keeps the 2^-30:
  // 2^-23 * (1 + 2^-7), which bf16 holds exactly (0x3401).
  const uint32_t hidden = 8;
  std::vector<uint16_t> row(hidden, float_to_bf16(1.0f + 0x1.0p-7f));
  const uint16_t* rows[2] = {row.data(), row.data()};
  const float weights[2] = {-1.0f, 1.0f + 0x1.0p-23f};
  std::vector<uint16_t> out(hidden);
  ll_combine_token(rows, weights, 2, hidden, out.data(), HostLanes{});
  CHECK(out[0] == 0x3400);
  CHECK(std::fma(weights[1], bf16_to_float(row[0]), -bf16_to_float(row[0])) != 0x1.0p-23f);

  Tensor idx = Tensor::empty(DType::i64, 1, 2), w = Tensor::empty(DType::f32, 1, 2);
  idx.data<int64_t>()[0] = 0;
  idx.data<int64_t>()[1] = 1;
  std::memcpy(w.data<float>(), weights, sizeof weights);
  const Tensor want =
      reference_ll_combine(idx, w, hidden, 0, [&](int64_t, int, int64_t) { return row.data(); });
  CHECK(want.data<uint16_t>()[0] == 0x3400);
}
