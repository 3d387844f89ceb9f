// route_completion: the proxy's bridge from a fabric completion to the immediates' sink
// (control/imm_sink.hpp: the rank's signal router, or the daemon's relay to it). The router
// (control/signal_router.hpp) decodes immediates and knows nothing of libfabric; the proxy
// threads own the rails, so the translation lives here. A remote_write completion is routed by
// its immediate; a local_write completion is not a signal (the proxy retires it itself), so it
// is refused: Status::error, and the sink's last_error() names its cookie and peer.
// Thread-safe as SignalRouter::route() is.
#pragma once

#include "common/error.hpp"
#include "control/imm_sink.hpp"
#include "fabric/transport.hpp"

namespace proxyep::proxy {

[[nodiscard]] Status route_completion(control::ImmSink& sink, const fabric::Completion& completion);

}  // namespace proxyep::proxy
