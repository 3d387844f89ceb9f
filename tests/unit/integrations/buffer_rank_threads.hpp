// Buffer tests with ranks as threads of this process (tests/unit/control/rank_threads.hpp): over
// tcp, with the reorder shim when asked, proxies unpinned (every rank's proxy shares this
// process's cores); the parameters are restored afterwards and every rank must succeed.
#pragma once

#include "common/params.hpp"
#include "tests/unit/control/rank_threads.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

namespace proxyep::integrations::testing {

inline void run_buffer_ranks(int ranks, bool reorder, const control::testing::RankBody& body,
                             const std::string& fabric = "tcp") {
  const std::string provider = params::fabric_provider.get();
  params::fabric_provider.set(fabric);
  params::fabric_reorder.set(reorder);
  params::proxy_pin.set(false);
  std::vector<control::testing::RankBody> bodies(static_cast<size_t>(ranks), body);
  auto outcomes = control::testing::run_bodies(bodies, ranks, std::chrono::milliseconds(20000));
  params::fabric_reorder.set(false);
  params::fabric_provider.set(provider);
  params::proxy_pin.set(true);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].ok);
  }
}

}  // namespace proxyep::integrations::testing
