#include "control/bootstrap_wire.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace proxyep::control::wire {
namespace {

void put_u16(Bytes& out, uint16_t value) {
  out.push_back(static_cast<uint8_t>(value));
  out.push_back(static_cast<uint8_t>(value >> 8));
}

void put_u32(Bytes& out, uint32_t value) {
  for (int shift = 0; shift < 32; shift += 8)
    out.push_back(static_cast<uint8_t>(value >> shift));
}

// Reads little-endian fields from a payload, throwing BadFrame instead of reading past its end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint8_t u8() { return take(1)[0]; }
  uint32_t u32() {
    auto field = take(4);
    return uint32_t{field[0]} | uint32_t{field[1]} << 8 | uint32_t{field[2]} << 16 |
           uint32_t{field[3]} << 24;
  }
  std::span<const uint8_t> take(size_t count) {
    if (count > bytes_.size() - offset_)
      throw BadFrame(fmt::format("payload truncated: needs {} more bytes at offset {}, has {}",
                                 count, offset_, bytes_.size() - offset_));
    auto field = bytes_.subspan(offset_, count);
    offset_ += count;
    return field;
  }
  size_t left() const { return bytes_.size() - offset_; }
  std::string text(size_t max_bytes, std::string_view what) {
    uint32_t length = u32();
    if (length > max_bytes)
      throw BadFrame(
          fmt::format("{} of {} bytes exceeds the limit of {}", what, length, max_bytes));
    return as_text(take(length));
  }
  template <size_t N>
  void copy_to(std::array<uint8_t, N>& out) {
    auto field = take(N);
    std::copy(field.begin(), field.end(), out.begin());
  }
  std::optional<Mac> mac() {
    uint8_t length = u8();
    if (length == 0) return std::nullopt;
    if (length != kMacBytes)
      throw BadFrame(fmt::format("a MAC of {} bytes (expected 0 or {})", length, kMacBytes));
    Mac value{};
    copy_to(value);
    return value;
  }
  void expect_end(std::string_view what) {
    if (left() != 0) throw BadFrame(fmt::format("{} has {} trailing bytes", what, left()));
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

void put_text(Bytes& out, std::string_view text) {
  put_u32(out, static_cast<uint32_t>(text.size()));
  auto bytes = as_bytes(text);
  out.insert(out.end(), bytes.begin(), bytes.end());
}

void put_mac(Bytes& out, const std::optional<Mac>& mac) {
  out.push_back(mac ? static_cast<uint8_t>(mac->size()) : 0);
  if (mac) out.insert(out.end(), mac->begin(), mac->end());
}

uint16_t get_u16(std::span<const uint8_t> bytes, size_t at) {
  return static_cast<uint16_t>(bytes[at] | bytes[at + 1] << 8);
}

uint32_t get_u32(std::span<const uint8_t> bytes, size_t at) {
  return uint32_t{bytes[at]} | uint32_t{bytes[at + 1]} << 8 | uint32_t{bytes[at + 2]} << 16 |
         uint32_t{bytes[at + 3]} << 24;
}

}  // namespace

std::string_view to_string(Kind kind) {
  switch (kind) {
    case Kind::hello:
      return "hello";
    case Kind::welcome:
      return "welcome";
    case Kind::enter:
      return "enter";
    case Kind::contribute:
      return "contribute";
    case Kind::result:
      return "result";
    case Kind::abort:
      return "abort";
    case Kind::challenge:
      return "challenge";
  }
  return "unknown";
}

std::string_view to_string(Op op) {
  switch (op) {
    case Op::rendezvous:
      return "rendezvous";
    case Op::allgather:
      return "allgather";
    case Op::barrier:
      return "barrier";
    case Op::broadcast:
      return "broadcast";
  }
  return "unknown";
}

Bytes encode_frame(Header header, std::span<const uint8_t> payload) {
  Bytes out;
  out.reserve(kHeaderBytes + payload.size());
  header.length = static_cast<uint32_t>(payload.size());
  put_u32(out, header.magic);
  put_u16(out, header.version);
  out.push_back(static_cast<uint8_t>(header.kind));
  out.push_back(static_cast<uint8_t>(header.op));
  put_u32(out, header.seq);
  put_u32(out, header.rank);
  put_u32(out, header.aux);
  put_u32(out, header.length);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Header decode_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes)
    throw BadFrame(fmt::format("header truncated: {} bytes of {}", bytes.size(), kHeaderBytes));
  Header header;
  header.magic = get_u32(bytes, 0);
  if (header.magic != kMagic)
    throw BadFrame(fmt::format("bad magic 0x{:08x} (expected 0x{:08x})", header.magic, kMagic));
  header.version = get_u16(bytes, 4);
  header.kind = static_cast<Kind>(bytes[6]);
  header.op = static_cast<Op>(bytes[7]);
  header.seq = get_u32(bytes, 8);
  header.rank = get_u32(bytes, 12);
  header.aux = get_u32(bytes, 16);
  header.length = get_u32(bytes, 20);
  if (header.length > kMaxPayloadBytes)
    throw BadFrame(fmt::format("payload of {} bytes exceeds the limit of {}", header.length,
                               kMaxPayloadBytes));
  return header;
}

Bytes encode_challenge(const Challenge& challenge) {
  Bytes out;
  out.push_back(challenge.secret_required ? 1 : 0);
  out.insert(out.end(), challenge.nonce.begin(), challenge.nonce.end());
  put_text(out, challenge.job_id);
  return out;
}

Challenge decode_challenge(std::span<const uint8_t> payload) {
  Reader reader(payload);
  Challenge challenge;
  uint8_t flags = reader.u8();
  if ((flags & ~1u) != 0) throw BadFrame(fmt::format("unknown challenge flags 0x{:02x}", flags));
  challenge.secret_required = (flags & 1u) != 0;
  reader.copy_to(challenge.nonce);
  challenge.job_id = reader.text(kMaxJobIdBytes, "the job id");
  reader.expect_end("the challenge");
  return challenge;
}

Bytes encode_hello(const Hello& hello) {
  Bytes out;
  put_text(out, hello.job_id);
  out.insert(out.end(), hello.nonce.begin(), hello.nonce.end());
  put_mac(out, hello.mac);
  auto identity = as_bytes(hello.identity);
  out.insert(out.end(), identity.begin(), identity.end());
  return out;
}

Hello decode_hello(std::span<const uint8_t> payload) {
  Reader reader(payload);
  Hello hello;
  hello.job_id = reader.text(kMaxJobIdBytes, "the job id");
  reader.copy_to(hello.nonce);
  hello.mac = reader.mac();
  hello.identity = as_text(reader.take(reader.left()));
  return hello;
}

Bytes encode_welcome(const Welcome& welcome) {
  Bytes out;
  put_mac(out, welcome.mac);
  return out;
}

Welcome decode_welcome(std::span<const uint8_t> payload) {
  Reader reader(payload);
  Welcome welcome;
  welcome.mac = reader.mac();
  reader.expect_end("the welcome");
  return welcome;
}

Bytes encode_contribution(std::string_view phase, std::span<const uint8_t> data) {
  Bytes out;
  out.reserve(4 + phase.size() + data.size());
  put_u32(out, static_cast<uint32_t>(phase.size()));
  auto text = as_bytes(phase);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Contribution decode_contribution(std::span<const uint8_t> payload) {
  Reader reader(payload);
  Contribution contribution;
  contribution.phase = as_text(reader.take(reader.u32()));
  auto data = reader.take(reader.left());
  contribution.data.assign(data.begin(), data.end());
  return contribution;
}

Bytes encode_list(const std::vector<Bytes>& parts) {
  size_t total = 4 + 4 * parts.size();
  for (const auto& part : parts)
    total += part.size();
  Bytes out;
  out.reserve(total);
  put_u32(out, static_cast<uint32_t>(parts.size()));
  for (const auto& part : parts)
    put_u32(out, static_cast<uint32_t>(part.size()));
  for (const auto& part : parts)
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<Bytes> decode_list(std::span<const uint8_t> payload) {
  Reader reader(payload);
  uint32_t count = reader.u32();
  if (count > reader.left() / 4)
    throw BadFrame(fmt::format("list claims {} parts in {} bytes", count, payload.size()));
  std::vector<uint32_t> sizes(count);
  for (auto& size : sizes)
    size = reader.u32();
  std::vector<Bytes> parts(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto part = reader.take(sizes[i]);
    parts[i].assign(part.begin(), part.end());
  }
  if (reader.left() != 0) throw BadFrame(fmt::format("list has {} trailing bytes", reader.left()));
  return parts;
}

}  // namespace proxyep::control::wire
