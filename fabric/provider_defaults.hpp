// Tuning that libfabric's utility providers read only from the environment, and only once: when
// the process's first fi_getinfo loads them. ProxyEP's defaults are put there before that call
// (never over a value the environment already has), so they hold for every rank and every tool.
#pragma once

namespace proxyep::fabric {

// Idempotent; the first call sets what the parameters say (fabric.rxm_buffer_bytes), later ones
// do nothing. Has no effect when this process loaded libfabric's providers before.
void apply_provider_defaults();

}  // namespace proxyep::fabric
