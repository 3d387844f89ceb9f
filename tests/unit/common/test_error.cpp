#include "common/deadline.hpp"
#include "common/error.hpp"

#include <doctest/doctest.h>

#include <thread>

using namespace proxyep;

TEST_CASE("Error carries its phase and message, and what() names both") {
  try {
    fail("bootstrap.allgather", "ranks {} did not arrive", "2, 3");
    FAIL("fail() returned");
  } catch (const Error& e) {
    CHECK(e.phase() == "bootstrap.allgather");
    CHECK(e.message() == "ranks 2, 3 did not arrive");
    CHECK(std::string(e.what()) == "bootstrap.allgather: ranks 2, 3 did not arrive");
  }
}

TEST_CASE("require throws only when the condition is false") {
  CHECK_NOTHROW(require(true, "setup", "never"));
  CHECK_THROWS_AS(require(false, "setup", "bad {}", 1), Error);
}

TEST_CASE("Status names") {
  CHECK(to_string(Status::again) == "again");
  CHECK(to_string(Status::peer_failed) == "peer failed");
}

TEST_CASE("Deadline expires after its timeout, not before") {
  auto deadline = Deadline::after_ms(30);
  CHECK_FALSE(deadline.expired());
  CHECK(deadline.remaining().count() > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  CHECK(deadline.expired());
  CHECK(deadline.remaining().count() == 0);
}
