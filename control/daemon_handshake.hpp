// The handshake every connection to proxyepd starts with (frames of daemon_frames.hpp).
//
//   client -> daemon  {"proxyep":"hello","version":1,"kind":"status"|"attach","pid":N,
//                      "capabilities":[...]}
//   daemon -> client  {"proxyep":"welcome","version":1,"daemon_pid":N,
//                      "capabilities":["status","attach"]}
//                  or {"proxyep":"error","error":"why"}, then the daemon closes
//
// `version` is the protocol's, bumped when a message changes meaning; the daemon refuses any
// other (naming both), so mixed builds fail at the handshake, not later. `kind` says what the
// client wants: `status` gets one status frame after the welcome (daemon/status_report.hpp);
// `attach` goes on with the attach protocol (daemon/attached_client.hpp): the client hands over
// its rings and buffers (memfds over SCM_RIGHTS) and the daemon's proxy drains them. `capabilities`
// lets later builds add features within a version: each side lists what it can do and uses the
// intersection. Unknown keys are ignored. A hello is the peer's claim: its `pid` is informational,
// the kernel's SO_PEERCRED is what the daemon trusts (access_policy.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::control {

inline constexpr int kProtocolVersion = 1;

enum class ClientKind { status, attach };
std::string_view to_string(ClientKind kind);

struct Hello {
  int64_t version = kProtocolVersion;
  ClientKind kind = ClientKind::status;
  int64_t pid = 0;
  std::vector<std::string> capabilities;
};

// A hello as a client sends it.
nlohmann::json hello_message(const Hello& hello);

// The parsed hello, or why the message is not a hello this daemon speaks (wrong magic, another
// protocol version, an unknown kind, malformed fields).
struct HelloCheck {
  std::optional<Hello> hello;
  std::string problem;
};
HelloCheck check_hello(const nlohmann::json& message);

// What this build serves, as the welcome lists it.
std::vector<std::string> daemon_capabilities();

nlohmann::json welcome_message(int64_t daemon_pid);
nlohmann::json error_message(std::string_view error);

// A message's type ("hello", "welcome", "status", "error"), or "" when it has none.
std::string message_type(const nlohmann::json& message);

}  // namespace proxyep::control
