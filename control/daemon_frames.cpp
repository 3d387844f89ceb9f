#include "control/daemon_frames.hpp"

#include "common/error.hpp"

#include <fmt/format.h>

namespace proxyep::control {
namespace {

uint32_t read_length(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

}  // namespace

std::string encode_frame(const nlohmann::json& message) {
  // Invalid UTF-8 in a string (a path from the file system) is replaced, never a throw.
  const std::string text = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  require(text.size() <= kMaxFrameBytes, "daemon.wire",
          "a message of {} bytes exceeds the frame limit of {} bytes", text.size(), kMaxFrameBytes);
  const auto n = static_cast<uint32_t>(text.size());
  std::string frame;
  frame.reserve(kFrameHeaderBytes + text.size());
  for (int shift = 0; shift < 32; shift += 8)
    frame.push_back(static_cast<char>((n >> shift) & 0xff));
  frame += text;
  return frame;
}

void FrameDecoder::feed(std::span<const char> bytes) {
  if (!error_.empty()) return;
  // Drop what was already returned before growing (a client sends a frame or two in all).
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
}

FrameDecoder::Result FrameDecoder::next(nlohmann::json& message, std::string& problem) {
  if (!error_.empty()) {
    problem = error_;
    return Result::error;
  }
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return Result::need_more;
  const uint32_t length = read_length(buffer_.data() + consumed_);
  if (length > kMaxFrameBytes) {
    error_ =
        fmt::format("a frame of {} bytes exceeds the limit of {} bytes", length, kMaxFrameBytes);
    problem = error_;
    return Result::error;
  }
  if (available < kFrameHeaderBytes + length) return Result::need_more;
  const char* payload = buffer_.data() + consumed_ + kFrameHeaderBytes;
  consumed_ += kFrameHeaderBytes + length;
  message = nlohmann::json::parse(payload, payload + length, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded())
    error_ = fmt::format("a frame of {} bytes does not hold valid JSON", length);
  else if (!message.is_object())
    error_ = fmt::format("a frame must hold a JSON object, not {}", message.type_name());
  if (!error_.empty()) {
    problem = error_;
    return Result::error;
  }
  return Result::frame;
}

std::string FrameDecoder::partial_text() const {
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes)
    return fmt::format("{} of {} header bytes", available, kFrameHeaderBytes);
  return fmt::format("{} of {} payload bytes", available - kFrameHeaderBytes,
                     read_length(buffer_.data() + consumed_));
}

std::string hex_encode(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    text.push_back(kDigits[b >> 4]);
    text.push_back(kDigits[b & 15]);
  }
  return text;
}

std::vector<uint8_t> hex_decode(std::string_view text, std::string_view what,
                                std::string_view phase) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  require(text.size() % 2 == 0, phase, "{}: {} hex digits (an odd count)", what, text.size());
  std::vector<uint8_t> bytes(text.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int high = digit(text[2 * i]), low = digit(text[2 * i + 1]);
    require(high >= 0 && low >= 0, phase, "{}: not hex at character {}", what, 2 * i);
    bytes[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return bytes;
}

}  // namespace proxyep::control
