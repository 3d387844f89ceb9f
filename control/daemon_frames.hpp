// The daemon's wire: every message is one frame, a 4-byte little-endian payload length followed
// by that many bytes of JSON (one object). Clients and the daemon speak only this on the Unix
// socket, so any language with a JSON library can be a client (the integration tests speak it
// from Python):
//
//   offset  size  field
//        0     4  length   payload bytes, little-endian; at most kMaxFrameBytes
//        4     n  payload  UTF-8 JSON text of one object
//
// Why JSON and not the bootstrap's packed records: the control plane is a handful of small
// messages per client lifetime, it must stay readable across versions (unknown keys are
// ignored, a `version` and `kind` in the hello decide the rest), and operators debug it with
// socat. The data path never goes through here: rings and buffers travel as file descriptors.
//
// The decoder is incremental: feed() whatever recv() returned, then next() until it says it
// needs more. A length over the limit is refused as soon as its 4 bytes arrive (a stranger
// cannot make the daemon buffer a gigabyte); malformed JSON and a payload that is not an object
// are refused when the frame is complete. After an error the decoder is spent: the connection
// is closed, there is no resynchronising on a stream.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::control {

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr uint32_t kMaxFrameBytes = uint32_t{1} << 20;  // 1 MiB of JSON

// The frame of `message`. Throws proxyep::Error("daemon.wire") when its JSON exceeds
// kMaxFrameBytes (a bug of the sender, never the peer's fault).
std::string encode_frame(const nlohmann::json& message);

// Binary fields (fabric addresses, region descriptors) travel as lowercase hex strings.
std::string hex_encode(std::span<const uint8_t> bytes);
// Throws proxyep::Error(phase) naming `what` for odd lengths or non-hex characters.
std::vector<uint8_t> hex_decode(std::string_view text, std::string_view what,
                                std::string_view phase);

class FrameDecoder {
 public:
  enum class Result { need_more, frame, error };

  void feed(std::span<const char> bytes);
  // The next complete message into `message`; on Result::error, `problem` says why (and every
  // later call returns the same error).
  Result next(nlohmann::json& message, std::string& problem);

  // True when some bytes of a frame have arrived but not all of it: an end of stream now means
  // the peer cut a frame short.
  bool mid_frame() const { return buffer_.size() > consumed_; }
  // "3 of 4 header bytes" / "10 of 77 payload bytes": what a cut frame had, for messages.
  std::string partial_text() const;

 private:
  std::string buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already returned as frames
  std::string error_;
};

}  // namespace proxyep::control
