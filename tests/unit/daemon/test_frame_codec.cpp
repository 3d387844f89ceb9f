// The frame codec: round trips, frames split anywhere, a truncated frame, an oversize length
// (refused from its header alone), bad JSON, a payload that is not an object.
#include "common/error.hpp"
#include "daemon/frame_codec.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace proxyep;
using namespace proxyep::daemon;
using nlohmann::json;

namespace {

std::string frame_of_text(const std::string& text) {
  const auto n = static_cast<uint32_t>(text.size());
  std::string frame{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                    static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  return frame + text;
}

FrameDecoder::Result decode(FrameDecoder& decoder, const std::string& bytes, json& message,
                            std::string& problem) {
  decoder.feed({bytes.data(), bytes.size()});
  return decoder.next(message, problem);
}

}  // namespace

TEST_CASE("a frame is a 4-byte little-endian length and the JSON text") {
  const std::string frame = encode_frame({{"proxyep", "hello"}});
  const std::string text = R"({"proxyep":"hello"})";
  CHECK(frame == frame_of_text(text));
  CHECK(static_cast<unsigned char>(frame[0]) == text.size());
  CHECK(frame[1] == 0);
}

TEST_CASE("frames fed one byte at a time, two in one feed") {
  const json a = {{"proxyep", "hello"}, {"version", 1}, {"capabilities", {"x", "y"}}};
  const json b = {{"proxyep", "status"}, {"pid", 42}};
  const std::string bytes = encode_frame(a) + encode_frame(b);
  FrameDecoder decoder;
  json message;
  std::string problem;
  std::vector<json> got;
  for (char c : bytes) {
    decoder.feed({&c, 1});
    while (decoder.next(message, problem) == FrameDecoder::Result::frame)
      got.push_back(message);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0] == a);
  CHECK(got[1] == b);
  CHECK_FALSE(decoder.mid_frame());

  FrameDecoder together;
  together.feed({bytes.data(), bytes.size()});
  CHECK(together.next(message, problem) == FrameDecoder::Result::frame);
  CHECK(message == a);
  CHECK(together.next(message, problem) == FrameDecoder::Result::frame);
  CHECK(message == b);
  CHECK(together.next(message, problem) == FrameDecoder::Result::need_more);
}

TEST_CASE("a truncated frame needs more and says what it has") {
  const std::string frame = encode_frame({{"proxyep", "hello"}});
  FrameDecoder header_only;
  json message;
  std::string problem;
  CHECK(decode(header_only, frame.substr(0, 3), message, problem) ==
        FrameDecoder::Result::need_more);
  CHECK(header_only.mid_frame());
  CHECK(header_only.partial_text() == "3 of 4 header bytes");

  FrameDecoder cut;
  CHECK(decode(cut, frame.substr(0, frame.size() - 1), message, problem) ==
        FrameDecoder::Result::need_more);
  CHECK(cut.mid_frame());
  CHECK(cut.partial_text() ==
        fmt::format("{} of {} payload bytes", frame.size() - 5, frame.size() - 4));
}

TEST_CASE("an oversize length is refused from the header alone") {
  FrameDecoder decoder;
  json message;
  std::string problem;
  const uint32_t n = kMaxFrameBytes + 1;
  const std::string header{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                           static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  CHECK(decode(decoder, header, message, problem) == FrameDecoder::Result::error);
  CHECK(problem == "a frame of 1048577 bytes exceeds the limit of 1048576 bytes");
  // Spent: later bytes change nothing.
  CHECK(decode(decoder, encode_frame({{"a", 1}}), message, problem) == FrameDecoder::Result::error);

  FrameDecoder at_limit;  // exactly the limit is a frame (here: a JSON string padded with spaces)
  std::string text = "{\"a\":1}";
  text.resize(kMaxFrameBytes, ' ');
  CHECK(decode(at_limit, frame_of_text(text), message, problem) == FrameDecoder::Result::frame);
}

TEST_CASE("bad JSON, and JSON that is not an object, are errors") {
  json message;
  std::string problem;
  FrameDecoder bad;
  CHECK(decode(bad, frame_of_text("{\"proxyep\":"), message, problem) ==
        FrameDecoder::Result::error);
  CHECK(problem == "a frame of 11 bytes does not hold valid JSON");
  FrameDecoder empty;
  CHECK(decode(empty, frame_of_text(""), message, problem) == FrameDecoder::Result::error);
  FrameDecoder array;
  CHECK(decode(array, frame_of_text("[1,2]"), message, problem) == FrameDecoder::Result::error);
  CHECK(problem == "a frame must hold a JSON object, not array");
}

TEST_CASE("encoding more than the limit is the sender's error") {
  const json big = {{"x", std::string(kMaxFrameBytes, 'a')}};
  CHECK_THROWS_WITH_AS(encode_frame(big),
                       doctest::Contains("exceeds the frame limit of 1048576 bytes"), Error);
}
