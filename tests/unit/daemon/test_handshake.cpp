// The handshake's checks: a good hello, wrong magic, another version (both named), an unknown
// kind, malformed fields, and the kinds this build serves.
#include "common/error.hpp"
#include "control/daemon_frames.hpp"
#include "control/daemon_handshake.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using nlohmann::json;

namespace {

json good_hello() {
  return {{"proxyep", "hello"},
          {"version", 1},
          {"kind", "status"},
          {"pid", 1234},
          {"capabilities", {"status"}}};
}

}  // namespace

TEST_CASE("a hello round-trips through control::hello_message and control::check_hello") {
  control::Hello hello;
  hello.kind = control::ClientKind::attach;
  hello.pid = 77;
  hello.capabilities = {"memfd"};
  const control::HelloCheck check = control::check_hello(control::hello_message(hello));
  REQUIRE(check.hello);
  CHECK(check.problem.empty());
  CHECK(check.hello->kind == control::ClientKind::attach);
  CHECK(check.hello->pid == 77);
  CHECK(check.hello->capabilities == std::vector<std::string>{"memfd"});
  // Unknown keys are ignored; capabilities may be left out.
  json extra = good_hello();
  extra["future"] = {{"x", 1}};
  extra.erase("capabilities");
  CHECK(control::check_hello(extra).hello);
}

TEST_CASE("wrong magic") {
  json message = good_hello();
  message["proxyep"] = "welcome";
  CHECK(control::check_hello(message).problem.starts_with("not a proxyep hello"));
  CHECK(control::check_hello(json{{"hello", 1}}).problem.starts_with("not a proxyep hello"));
  CHECK_FALSE(control::check_hello(json{{"hello", 1}}).hello);
}

TEST_CASE("another protocol version is refused naming both") {
  json message = good_hello();
  message["version"] = 999;
  const control::HelloCheck check = control::check_hello(message);
  CHECK_FALSE(check.hello);
  CHECK(check.problem.find("protocol version 999") != std::string::npos);
  CHECK(check.problem.find("speaks version 1") != std::string::npos);
  message["version"] = "1";
  CHECK(control::check_hello(message).problem == "a hello must carry an integer \"version\"");
}

TEST_CASE("an unknown kind, and malformed pid or capabilities") {
  json message = good_hello();
  message["kind"] = "dance";
  CHECK(control::check_hello(message).problem == "unknown kind \"dance\" (kinds: status, attach)");
  message = good_hello();
  message["pid"] = -1;
  CHECK(control::check_hello(message).problem.find("\"pid\"") != std::string::npos);
  message = good_hello();
  message["capabilities"] = {1, 2};
  CHECK(control::check_hello(message).problem == "\"capabilities\" must be an array of strings");
}

TEST_CASE("this build serves status and attach") {
  CHECK(control::daemon_capabilities() == std::vector<std::string>{"status", "attach"});
  const json welcome = control::welcome_message(5);
  CHECK(control::message_type(welcome) == "welcome");
  CHECK(welcome["version"] == control::kProtocolVersion);
  CHECK(welcome["daemon_pid"] == 5);
  CHECK(control::message_type(control::error_message("why")) == "error");
  CHECK(control::message_type(json::array()) == "");
}

TEST_CASE("binary fields travel as hex") {
  const std::vector<uint8_t> bytes{0x00, 0x7f, 0x80, 0xff, 0x12};
  CHECK(control::hex_encode(bytes) == "007f80ff12");
  CHECK(control::hex_decode("007F80ff12", "x", "test") == bytes);
  CHECK_THROWS_WITH_AS(control::hex_decode("abc", "addresses", "test"),
                       doctest::Contains("addresses: 3 hex digits (an odd count)"), Error);
  CHECK_THROWS_WITH_AS(control::hex_decode("zz", "arena", "test"),
                       doctest::Contains("arena: not hex at character 0"), Error);
}
