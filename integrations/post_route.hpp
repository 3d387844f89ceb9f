// PostRoute: for the span of a call's writes to other nodes, hands them to the stream of the
// device backend that fills their sources (proxy::Session::route_posts), so that the protocol
// posts a chunk the moment its packing is queued rather than once it has run: the stream pushes
// the write to the proxies after the kernels before it. Off for the host backend, on one node,
// or where the session has no device ring; then the protocol waits for the backend's work
// before posting (PublishQueue), as before.
#pragma once

#include "common/log.hpp"
#include "integrations/backend/row_backend.hpp"
#include "proxy/session.hpp"

#include <string_view>

namespace proxyep::integrations {

class PostRoute {
 public:
  PostRoute(proxy::Session& session, const RowBackend& backend, std::string_view phase)
      : session_(session), on_(routes(session, backend, phase)) {}
  // Hands the stream what was posted last, then ends the route. A stream that fails the flush
  // fails the call at its next wait (which drives the stream), so the error is only logged here.
  ~PostRoute() {
    if (!on_) return;
    try {
      session_.flush_posts();
    } catch (const std::exception& e) {
      log::warn("buffer: handing writes to the device's stream: {}", e.what());
    }
    session_.route_posts(nullptr, {});
  }
  PostRoute(const PostRoute&) = delete;
  PostRoute& operator=(const PostRoute&) = delete;

 private:
  static bool routes(proxy::Session& session, const RowBackend& backend, std::string_view phase) {
    const auto device = backend.stream();
    return device != nullptr && session.route_posts(device, phase);
  }

  proxy::Session& session_;
  const bool on_;
};

}  // namespace proxyep::integrations
