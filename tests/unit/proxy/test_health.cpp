// Health: the first failure fails the engine; with peer failures tolerated (rank masking), a
// failure that names a peer gives up that peer only.
#include "proxy/engine/health.hpp"

#include <doctest/doctest.h>

using proxyep::proxy::Failure;
using proxyep::proxy::Health;

TEST_CASE("health: the first failure is kept and fails every waiter") {
  Health health;
  CHECK_FALSE(health.failed());
  CHECK(health.record(Failure{"proxy.post", 2, "first"}));
  CHECK_FALSE(health.record(Failure{"proxy.post", 1, "second"}));
  CHECK(health.failed());
  CHECK(health.failure()->message == "first");
  CHECK_THROWS_WITH(health.throw_if_failed(), "proxy.post: first");
  CHECK_FALSE(health.peer_failed(2));  // not tolerated: the engine failed instead
}

TEST_CASE("health: tolerated peer failures give up the peer only") {
  Health health;
  health.tolerate_peer_failures(4);
  CHECK(health.record(Failure{"proxy.peer", 2, "rank 2 left the job"}));
  CHECK_FALSE(health.record(Failure{"proxy.complete", 2, "a write to it failed"}));
  CHECK_FALSE(health.failed());
  CHECK_NOTHROW(health.throw_if_failed());
  CHECK(health.peer_failed(2));
  CHECK_FALSE(health.peer_failed(1));
  CHECK(health.peer_failure(2)->message == "rank 2 left the job");
  CHECK_FALSE(health.peer_failure(1).has_value());
  // A failure naming no peer still fails the engine.
  CHECK(health.record(Failure{"proxy.route", -1, "a bad immediate"}));
  CHECK(health.failed());
}
