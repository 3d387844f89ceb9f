// Idle policy: spin, then yield, then sleep; work resets it; a waiter keeps it awake; a driving
// waiter sends it to sleep.
#include "proxy/engine/idle_policy.hpp"

#include <doctest/doctest.h>

using namespace proxyep::proxy;
using Step = IdlePolicy::Step;

TEST_CASE("empty passes spin, then yield, then sleep; work starts over") {
  IdlePolicy policy({.spin_passes = 3, .yield_passes = 2, .sleep_us = 100});
  const Step expected[] = {Step::spin,  Step::spin,  Step::spin, Step::yield,
                           Step::yield, Step::sleep, Step::sleep};
  for (Step step : expected)
    CHECK(policy.after_pass(false, false) == step);
  CHECK(policy.after_pass(true, false) == Step::spin);
  CHECK(policy.empty_passes() == 0);
  CHECK(policy.after_pass(false, false) == Step::spin);
}

TEST_CASE("a waiter keeps the proxy at the yield stage") {
  IdlePolicy policy({.spin_passes = 1, .yield_passes = 1, .sleep_us = 100});
  CHECK(policy.after_pass(false, true) == Step::spin);
  for (int i = 0; i < 10; ++i)
    CHECK(policy.after_pass(false, true) == Step::yield);
  CHECK(policy.after_pass(false, false) == Step::sleep);
}

TEST_CASE("zero spin and yield passes sleep at once") {
  IdlePolicy policy({.spin_passes = 0, .yield_passes = 0, .sleep_us = 100});
  CHECK(policy.after_pass(false, false) == Step::sleep);
}

TEST_CASE("a driving waiter sends an empty pass to sleep at once; work still spins") {
  IdlePolicy policy({.spin_passes = 100, .yield_passes = 100, .sleep_us = 100});
  CHECK(policy.after_pass(false, true, true) == Step::sleep);
  CHECK(policy.after_pass(true, true, true) == Step::spin);
  CHECK(policy.after_pass(false, true, false) == Step::spin);  // the driver left: spin again
}
