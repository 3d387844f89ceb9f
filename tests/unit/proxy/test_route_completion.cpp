// proxy::route_completion: fabric completions into the signal router (control/).
#include "common/error.hpp"
#include "control/counter_bank.hpp"
#include "control/imm_layout.hpp"
#include "control/signal_router.hpp"
#include "fabric/transport.hpp"
#include "proxy/engine/route_completion.hpp"

#include <doctest/doctest.h>

#include <string>

using proxyep::Status;
using proxyep::control::CounterBank;
using proxyep::control::SequenceWindow;
using proxyep::control::SignalRouter;
using proxyep::fabric::Completion;
using proxyep::proxy::route_completion;
namespace imm = proxyep::control::imm;

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
Completion remote(uint32_t raw) {
  Completion c;
  c.kind = Completion::Kind::remote_write;
  c.imm = raw;
  return c;
}
}  // namespace

TEST_CASE("route_completion: a remote write's immediate reaches its target") {
  CounterBank bank(16);
  SequenceWindow window(8);
  SignalRouter router;
  router.attach_counters(bank);
  router.attach_stream(5, window);

  REQUIRE(bank.set_expected(0, 9, 2) == Status::ok);
  REQUIRE(route_completion(router, remote(imm::encode_counter(0, 9))) == Status::ok);
  CHECK_FALSE(bank.ready(0, 9));
  REQUIRE(route_completion(router, remote(imm::encode_counter(0, 9))) == Status::ok);
  CHECK(bank.ready(0, 9));
  REQUIRE(route_completion(router, remote(imm::encode_stream(0, 5, 0))) == Status::ok);
  CHECK(window.tail() == 1);

  // The router's own errors come through unchanged.
  CHECK(route_completion(router, remote(imm::encode_stream(0, 6, 0))) == Status::error);
  CHECK(contains(router.last_error(), "no sequence window attached"));
}

TEST_CASE("route_completion: a local write is not a signal") {
  CounterBank bank(4);
  SignalRouter router;
  router.attach_counters(bank);
  REQUIRE(bank.set_expected(0, 1, 1) == Status::ok);
  Completion local;
  local.kind = Completion::Kind::local_write;
  local.cookie = 42;
  local.peer = 3;
  local.imm = imm::encode_counter(0, 1);  // ignored: a local completion carries no signal
  CHECK(route_completion(router, local) == Status::error);
  CHECK(contains(router.last_error(), "local_write completion (cookie 42, peer 3)"));
  CHECK_FALSE(bank.ready(0, 1));
}
