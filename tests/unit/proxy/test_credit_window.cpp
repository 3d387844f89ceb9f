// Credit windows: bounded writes and bytes in flight per destination, again when exhausted,
// credits back on release, and a single oversized write admitted alone.
#include "proxy/engine/credit_window.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::proxy;

TEST_CASE("a credit window bounds the writes in flight") {
  CreditWindow window({.writes = 3, .bytes = 1 << 20});
  for (int i = 0; i < 3; ++i)
    CHECK(window.acquire(10) == Status::ok);
  CHECK(window.acquire(10) == Status::again);
  CHECK(window.writes_in_flight() == 3);
  window.release(10);
  CHECK(window.acquire(10) == Status::ok);
  CHECK(window.acquire(0) == Status::again);
}

TEST_CASE("a credit window bounds the bytes in flight") {
  CreditWindow window({.writes = 100, .bytes = 1000});
  CHECK(window.acquire(600) == Status::ok);
  CHECK(window.acquire(400) == Status::ok);
  CHECK(window.acquire(1) == Status::again);
  CHECK(window.acquire(0) == Status::ok);  // zero-length signals need only a write credit
  CHECK(window.bytes_in_flight() == 1000);
  window.release(600);
  CHECK(window.acquire(601) == Status::again);
  CHECK(window.acquire(600) == Status::ok);
}

TEST_CASE("a write larger than the byte budget goes alone, never blocks forever") {
  CreditWindow window({.writes = 8, .bytes = 100});
  CHECK(window.acquire(5000) == Status::ok);
  CHECK(window.acquire(1) == Status::again);
  window.release(5000);
  CHECK(window.idle());
  CHECK(window.acquire(1) == Status::ok);
  CHECK(window.acquire(5000) == Status::again);
}

TEST_CASE("release never wraps the window past its limits") {
  CreditWindow window({.writes = 2, .bytes = 100});
  window.release(50);
  CHECK(window.writes_in_flight() == 0);
  CHECK(window.bytes_in_flight() == 0);
  CHECK(window.acquire(100) == Status::ok);
  CHECK(window.acquire(1) == Status::again);
}

TEST_CASE("windows are per destination") {
  CreditWindows windows(3, {.writes = 1, .bytes = 100});
  CHECK(windows.acquire(0, 10) == Status::ok);
  CHECK(windows.acquire(0, 10) == Status::again);
  CHECK(windows.acquire(2, 10) == Status::ok);
  CHECK(windows.writes_in_flight() == 2);
  windows.release(0, 10);
  CHECK(windows.acquire(0, 10) == Status::ok);
}

TEST_CASE("credit limits must be positive") {
  CHECK_THROWS_AS(CreditWindow({.writes = 0, .bytes = 1}), Error);
  CHECK_THROWS_AS(CreditWindow({.writes = 1, .bytes = 0}), Error);
}
