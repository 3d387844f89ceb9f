#include "control/daemon_handshake.hpp"

#include <fmt/format.h>

namespace proxyep::control {
namespace {

constexpr std::string_view kStatusCapability = "status";
constexpr std::string_view kAttachCapability = "attach";

// At most this much of a peer's text is quoted back (a message must not echo a megabyte).
std::string quoted(const nlohmann::json& value) {
  constexpr size_t kMaxQuote = 80;
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxQuote) text = text.substr(0, kMaxQuote) + "...";
  return text;
}

std::optional<ClientKind> parse_kind(const std::string& name) {
  if (name == "status") return ClientKind::status;
  if (name == "attach") return ClientKind::attach;
  return std::nullopt;
}

// "" when `message` carries the fields every hello must have; otherwise what is wrong.
std::string check_fields(const nlohmann::json& message, Hello& hello) {
  const auto version = message.find("version");
  if (version == message.end() || !version->is_number_integer())
    return "a hello must carry an integer \"version\"";
  hello.version = version->get<int64_t>();
  if (hello.version != kProtocolVersion)
    return fmt::format(
        "protocol version {} is not spoken here: this proxyepd speaks version {} (client and "
        "daemon come from different ProxyEP builds)",
        hello.version, kProtocolVersion);
  const auto kind = message.find("kind");
  if (kind == message.end() || !kind->is_string())
    return "a hello must carry a string \"kind\" (status or attach)";
  const auto parsed = parse_kind(kind->get<std::string>());
  if (!parsed) return fmt::format("unknown kind {} (kinds: status, attach)", quoted(*kind));
  hello.kind = *parsed;
  const auto pid = message.find("pid");
  if (pid == message.end() || !pid->is_number_integer() || pid->get<int64_t>() <= 0)
    return "a hello must carry the client's \"pid\" (a positive integer)";
  hello.pid = pid->get<int64_t>();
  const auto capabilities = message.find("capabilities");
  if (capabilities != message.end()) {
    if (!capabilities->is_array()) return "\"capabilities\" must be an array of strings";
    for (const auto& item : *capabilities) {
      if (!item.is_string()) return "\"capabilities\" must be an array of strings";
      hello.capabilities.push_back(item.get<std::string>());
    }
  }
  return "";
}

}  // namespace

std::string_view to_string(ClientKind kind) {
  return kind == ClientKind::status ? "status" : "attach";
}

nlohmann::json hello_message(const Hello& hello) {
  return {{"proxyep", "hello"},
          {"version", hello.version},
          {"kind", to_string(hello.kind)},
          {"pid", hello.pid},
          {"capabilities", hello.capabilities}};
}

HelloCheck check_hello(const nlohmann::json& message) {
  HelloCheck check;
  if (message_type(message) != "hello") {
    check.problem = fmt::format(
        "not a proxyep hello (expected {{\"proxyep\":\"hello\",\"version\":{},...}}, got {})",
        kProtocolVersion, quoted(message));
    return check;
  }
  Hello hello;
  check.problem = check_fields(message, hello);
  if (check.problem.empty()) check.hello = std::move(hello);
  return check;
}

std::vector<std::string> daemon_capabilities() {
  return {std::string(kStatusCapability), std::string(kAttachCapability)};
}

nlohmann::json welcome_message(int64_t daemon_pid) {
  return {{"proxyep", "welcome"},
          {"version", kProtocolVersion},
          {"daemon_pid", daemon_pid},
          {"capabilities", daemon_capabilities()}};
}

nlohmann::json error_message(std::string_view error) {
  return {{"proxyep", "error"}, {"error", error}};
}

std::string message_type(const nlohmann::json& message) {
  if (!message.is_object()) return "";
  const auto type = message.find("proxyep");
  return type != message.end() && type->is_string() ? type->get<std::string>() : "";
}

}  // namespace proxyep::control
