// The frame codec: round trips, frames split anywhere, a truncated frame, an oversize length
// (refused from its header alone), bad JSON, a payload that is not an object.
#include "common/error.hpp"
#include "control/daemon_frames.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace proxyep;
using nlohmann::json;

namespace {

std::string frame_of_text(const std::string& text) {
  const auto n = static_cast<uint32_t>(text.size());
  std::string frame{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                    static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  return frame + text;
}

control::FrameDecoder::Result decode(control::FrameDecoder& decoder, const std::string& bytes,
                                     json& message, std::string& problem) {
  decoder.feed({bytes.data(), bytes.size()});
  return decoder.next(message, problem);
}

}  // namespace

TEST_CASE("a frame is a 4-byte little-endian length and the JSON text") {
  const std::string frame = control::encode_frame({{"proxyep", "hello"}});
  const std::string text = R"({"proxyep":"hello"})";
  CHECK(frame == frame_of_text(text));
  CHECK(static_cast<unsigned char>(frame[0]) == text.size());
  CHECK(frame[1] == 0);
}

TEST_CASE("frames fed one byte at a time, two in one feed") {
  const json a = {{"proxyep", "hello"}, {"version", 1}, {"capabilities", {"x", "y"}}};
  const json b = {{"proxyep", "status"}, {"pid", 42}};
  const std::string bytes = control::encode_frame(a) + control::encode_frame(b);
  control::FrameDecoder decoder;
  json message;
  std::string problem;
  std::vector<json> got;
  for (char c : bytes) {
    decoder.feed({&c, 1});
    while (decoder.next(message, problem) == control::FrameDecoder::Result::frame)
      got.push_back(message);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0] == a);
  CHECK(got[1] == b);
  CHECK_FALSE(decoder.mid_frame());

  control::FrameDecoder together;
  together.feed({bytes.data(), bytes.size()});
  CHECK(together.next(message, problem) == control::FrameDecoder::Result::frame);
  CHECK(message == a);
  CHECK(together.next(message, problem) == control::FrameDecoder::Result::frame);
  CHECK(message == b);
  CHECK(together.next(message, problem) == control::FrameDecoder::Result::need_more);
}

TEST_CASE("a truncated frame needs more and says what it has") {
  const std::string frame = control::encode_frame({{"proxyep", "hello"}});
  control::FrameDecoder header_only;
  json message;
  std::string problem;
  CHECK(decode(header_only, frame.substr(0, 3), message, problem) ==
        control::FrameDecoder::Result::need_more);
  CHECK(header_only.mid_frame());
  CHECK(header_only.partial_text() == "3 of 4 header bytes");

  control::FrameDecoder cut;
  CHECK(decode(cut, frame.substr(0, frame.size() - 1), message, problem) ==
        control::FrameDecoder::Result::need_more);
  CHECK(cut.mid_frame());
  CHECK(cut.partial_text() ==
        fmt::format("{} of {} payload bytes", frame.size() - 5, frame.size() - 4));
}

TEST_CASE("an oversize length is refused from the header alone") {
  control::FrameDecoder decoder;
  json message;
  std::string problem;
  const uint32_t n = control::kMaxFrameBytes + 1;
  const std::string header{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                           static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  CHECK(decode(decoder, header, message, problem) == control::FrameDecoder::Result::error);
  CHECK(problem == "a frame of 1048577 bytes exceeds the limit of 1048576 bytes");
  // Spent: later bytes change nothing.
  CHECK(decode(decoder, control::encode_frame({{"a", 1}}), message, problem) ==
        control::FrameDecoder::Result::error);

  control::FrameDecoder
      at_limit;  // exactly the limit is a frame (here: a JSON string padded with spaces)
  std::string text = "{\"a\":1}";
  text.resize(control::kMaxFrameBytes, ' ');
  CHECK(decode(at_limit, frame_of_text(text), message, problem) ==
        control::FrameDecoder::Result::frame);
}

TEST_CASE("bad JSON, and JSON that is not an object, are errors") {
  json message;
  std::string problem;
  control::FrameDecoder bad;
  CHECK(decode(bad, frame_of_text("{\"proxyep\":"), message, problem) ==
        control::FrameDecoder::Result::error);
  CHECK(problem == "a frame of 11 bytes does not hold valid JSON");
  control::FrameDecoder empty;
  CHECK(decode(empty, frame_of_text(""), message, problem) == control::FrameDecoder::Result::error);
  control::FrameDecoder array;
  CHECK(decode(array, frame_of_text("[1,2]"), message, problem) ==
        control::FrameDecoder::Result::error);
  CHECK(problem == "a frame must hold a JSON object, not array");
}

TEST_CASE("encoding more than the limit is the sender's error") {
  const json big = {{"x", std::string(control::kMaxFrameBytes, 'a')}};
  CHECK_THROWS_WITH_AS(control::encode_frame(big),
                       doctest::Contains("exceeds the frame limit of 1048576 bytes"), Error);
}
