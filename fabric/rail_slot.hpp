// The per-operation context slot of a Rail (private to rail*.cpp).
#pragma once

#include "fabric/rail.hpp"

namespace proxyep::fabric {

struct Rail::OpSlot {
  // First member: the provider's scratch space (FI_CONTEXT / FI_CONTEXT2), and the address the
  // completion returns as op_context, which is the slot's own address.
  fi_context2 context{};
  bool is_receive = false;
  bool probe = false;  // a connection probe (rail_probe.cpp): its completion stays in the rail
  int peer = -1;
  uint64_t cookie = 0;
  size_t length = 0;
  uint64_t remote_address = 0;
  uint64_t remote_key = 0;
};

}  // namespace proxyep::fabric
