// The transport session's sizes (proxy/session/arena_layout.hpp) a Buffer of these options opens
// over a group of `ranks`: from the options and the ep.* parameters. The Buffer opens its session
// with them, and the memory model (memory_model.hpp) prices them without opening anything.
#pragma once

#include "integrations/buffer.hpp"
#include "proxy/session/arena_layout.hpp"

namespace proxyep::integrations {

// Throws proxyep::Error("buffer") for options no Buffer accepts (before anything is opened).
proxy::SessionSizes session_sizes(const BufferOptions& opts, int ranks, int ranks_per_node);

}  // namespace proxyep::integrations
