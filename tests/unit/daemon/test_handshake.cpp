// The handshake's checks: a good hello, wrong magic, another version (both named), an unknown
// kind, malformed fields, and the honest refusal of attach.
#include "daemon/handshake.hpp"

#include <doctest/doctest.h>

using namespace proxyep::daemon;
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

TEST_CASE("a hello round-trips through hello_message and check_hello") {
  Hello hello;
  hello.kind = ClientKind::attach;
  hello.pid = 77;
  hello.capabilities = {"memfd"};
  const HelloCheck check = check_hello(hello_message(hello));
  REQUIRE(check.hello);
  CHECK(check.problem.empty());
  CHECK(check.hello->kind == ClientKind::attach);
  CHECK(check.hello->pid == 77);
  CHECK(check.hello->capabilities == std::vector<std::string>{"memfd"});
  // Unknown keys are ignored; capabilities may be left out.
  json extra = good_hello();
  extra["future"] = {{"x", 1}};
  extra.erase("capabilities");
  CHECK(check_hello(extra).hello);
}

TEST_CASE("wrong magic") {
  json message = good_hello();
  message["proxyep"] = "welcome";
  CHECK(check_hello(message).problem.starts_with("not a proxyep hello"));
  CHECK(check_hello(json{{"hello", 1}}).problem.starts_with("not a proxyep hello"));
  CHECK_FALSE(check_hello(json{{"hello", 1}}).hello);
}

TEST_CASE("another protocol version is refused naming both") {
  json message = good_hello();
  message["version"] = 999;
  const HelloCheck check = check_hello(message);
  CHECK_FALSE(check.hello);
  CHECK(check.problem.find("protocol version 999") != std::string::npos);
  CHECK(check.problem.find("speaks version 1") != std::string::npos);
  message["version"] = "1";
  CHECK(check_hello(message).problem == "a hello must carry an integer \"version\"");
}

TEST_CASE("an unknown kind, and malformed pid or capabilities") {
  json message = good_hello();
  message["kind"] = "dance";
  CHECK(check_hello(message).problem == "unknown kind \"dance\" (kinds: status, attach)");
  message = good_hello();
  message["pid"] = -1;
  CHECK(check_hello(message).problem.find("\"pid\"") != std::string::npos);
  message = good_hello();
  message["capabilities"] = {1, 2};
  CHECK(check_hello(message).problem == "\"capabilities\" must be an array of strings");
}

TEST_CASE("this build serves status; attach is refused honestly") {
  CHECK(unsupported_kind(ClientKind::status).empty());
  CHECK(unsupported_kind(ClientKind::attach)
            .find("not available yet in this build: the daemon "
                  "serves status only") != std::string::npos);
  CHECK(daemon_capabilities() == std::vector<std::string>{"status"});
  const json welcome = welcome_message(5);
  CHECK(message_type(welcome) == "welcome");
  CHECK(welcome["version"] == kProtocolVersion);
  CHECK(welcome["daemon_pid"] == 5);
  CHECK(message_type(error_message("why")) == "error");
  CHECK(message_type(json::array()) == "");
}
