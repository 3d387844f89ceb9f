// Call numbering and broken sequences (call_sequence.hpp).
#include "integrations/normal/call_sequence.hpp"

namespace proxyep::integrations::normal {

void CallSequence::check_usable(std::string_view phase) const {
  if (!broken_.empty())
    fail(std::string(phase),
         "an earlier call failed ({}); the ranks are out of step: create a new Buffer", broken_);
  session_.check_health(phase);
}

uint64_t CallSequence::begin() {
  const uint64_t call = next_++;
  step([&] { session_.begin_call(call); });
  return call;
}

}  // namespace proxyep::integrations::normal
