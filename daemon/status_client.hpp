// The client side of `kind: status` (handshake.hpp): connect to a proxyepd, say hello, read the
// welcome and the status frame. What `proxyep status` runs; tests use it too.
//
// The whole exchange is bounded by `timeout`. Every failure is a proxyep::Error("daemon.status")
// that names the socket path and the reason, as a user reads it: "no proxyepd at /x/y.sock:
// connection refused (...)", "proxyepd at /x/y.sock refused this client: uid 65534 ...",
// "proxyepd at /x/y.sock did not answer within 2000 ms".
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

namespace proxyep::daemon {

struct StatusAnswer {
  nlohmann::json welcome;
  nlohmann::json status;
};

StatusAnswer query_status(const std::string& socket_path, std::chrono::milliseconds timeout);

}  // namespace proxyep::daemon
