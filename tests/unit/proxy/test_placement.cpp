// Placement: rails that share a domain share a thread; thread count and CPU lists.
#include "proxy/engine/placement.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::fabric::testing;

TEST_CASE("fake rails on one domain are driven by one thread") {
  auto fabric = fabric::Fabric::open(options_for("shm", 0, 3));
  auto topo = topology::discover();
  auto plans = plan_threads(*fabric, {.threads = 4, .pin = true, .cpus = ""}, &topo);
  REQUIRE(plans.size() == 1);
  CHECK(plans[0].rails == std::vector<int>{0, 1, 2});
  CHECK(!plans[0].pus.empty());  // shm has no NIC: any core
  auto unpinned = plan_threads(*fabric, {.threads = 0, .pin = false, .cpus = ""}, nullptr);
  REQUIRE(unpinned.size() == 1);
  CHECK(unpinned[0].pus.empty());
  auto listed = plan_threads(*fabric, {.threads = 1, .pin = true, .cpus = "1"}, nullptr);
  CHECK(listed[0].pus == std::vector<int>{1});
  CHECK_THROWS_AS(plan_threads(*fabric, {.threads = -1, .pin = false, .cpus = ""}, nullptr), Error);
}
