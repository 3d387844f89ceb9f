// route_completion: the proxy's bridge from a fabric completion to the signal router. The router
// (control/signal_router.hpp) decodes immediates and knows nothing of libfabric; the proxy
// threads own the rails, so the translation lives here. A remote_write completion is routed by
// its immediate; a local_write completion is not a signal (the proxy retires it itself), so it
// is refused: Status::error, and the router's last_error() names its cookie and peer.
// Thread-safe as SignalRouter::route() is.
#pragma once

#include "common/error.hpp"
#include "control/signal_router.hpp"
#include "fabric/transport.hpp"

namespace proxyep::proxy {

[[nodiscard]] Status route_completion(control::SignalRouter& router,
                                      const fabric::Completion& completion);

}  // namespace proxyep::proxy
