#include "fabric/provider_defaults.hpp"

#include "common/log.hpp"
#include "common/params.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

namespace proxyep::fabric {
namespace {

// rxm's message buffers: rx and tx pools of rx_size/tx_size buffers of this size per endpoint
// and per connection (~16 MiB each at the 16 KiB default: ~100 MiB per rank on tcp, measured
// with smaps). ProxyEP sends no messages through them: its data and signals are RMA writes.
constexpr const char* kRxmBufferSize = "FI_OFI_RXM_BUFFER_SIZE";

}  // namespace

void apply_provider_defaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int64_t bytes = params::fabric_rxm_buffer_bytes.get();
    if (bytes <= 0) return;
    if (const char* given = std::getenv(kRxmBufferSize); given != nullptr) {
      log::debug("fabric: {}={} from the environment", kRxmBufferSize, given);
      return;
    }
    ::setenv(kRxmBufferSize, std::to_string(bytes).c_str(), /*overwrite=*/0);
    log::debug("fabric: {}={} (fabric.rxm_buffer_bytes)", kRxmBufferSize, bytes);
  });
}

}  // namespace proxyep::fabric
