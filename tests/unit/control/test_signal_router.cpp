#include "common/error.hpp"
#include "control/signal_router.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using proxyep::Error;
using proxyep::Status;
using proxyep::control::CounterBank;
using proxyep::control::SenderCredits;
using proxyep::control::SequenceWindow;
using proxyep::control::SignalRouter;
namespace imm = proxyep::control::imm;

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("signal router: each op reaches its target") {
  CounterBank bank(16);
  SequenceWindow window(8);
  SenderCredits credits(8);
  SignalRouter router;
  router.attach_counters(bank);
  router.attach_stream(1023, window);
  router.attach_credits(7, credits);
  uint32_t control_payload = 0;
  router.set_control_handler([&](uint32_t, uint32_t payload) {
    control_payload = payload;
    return Status::ok;
  });

  REQUIRE(bank.set_expected(0, 9, 2) == Status::ok);
  REQUIRE(router.route(imm::encode_counter(0, 9)) == Status::ok);
  CHECK_FALSE(bank.ready(0, 9));
  REQUIRE(router.route(imm::encode_counter(0, 9)) == Status::ok);
  CHECK(bank.ready(0, 9));

  REQUIRE(router.route(imm::encode_stream(0, 1023, 1)) == Status::ok);
  CHECK(window.tail() == 0);
  REQUIRE(router.route(imm::encode_stream(3, 1023, 0)) == Status::ok);  // epoch tag ignored
  CHECK(window.tail() == 2);

  uint16_t seq = 0;
  for (int i = 0; i < 8; ++i)
    REQUIRE(credits.acquire(seq) == Status::ok);
  CHECK(credits.acquire(seq) == Status::again);
  REQUIRE(router.route(imm::encode_credit(0, 7, 5)) == Status::ok);
  CHECK(credits.available() == 5);

  REQUIRE(router.route(imm::encode_control(2, 0x1234567)) == Status::ok);
  CHECK(control_payload == 0x1234567);
}

TEST_CASE("signal router: errors name the immediate and the target's complaint") {
  CounterBank bank(4);
  SequenceWindow window(4);
  SignalRouter router;
  CHECK(router.route(imm::encode_counter(0, 1)) == Status::error);
  CHECK(contains(router.last_error(), "no counter bank attached"));
  router.attach_counters(bank);
  router.attach_stream(2, window);

  CHECK(router.route(imm::encode_counter(0, 4)) == Status::error);
  CHECK(contains(router.last_error(), "counter, epoch tag 0, key 4"));
  CHECK(contains(router.last_error(), "only 4 keys exist"));

  CHECK(router.route(imm::encode_stream(0, 3, 0)) == Status::error);
  CHECK(contains(router.last_error(), "stream 3"));
  CHECK(contains(router.last_error(), "no sequence window attached"));
  REQUIRE(router.route(imm::encode_stream(0, 2, 1)) == Status::ok);
  CHECK(router.route(imm::encode_stream(0, 2, 1)) == Status::error);
  CHECK(contains(router.last_error(), "completed twice"));

  CHECK(router.route(imm::encode_credit(0, 2, 1)) == Status::error);
  CHECK(contains(router.last_error(), "no sender credits attached"));
  CHECK(router.route(imm::encode_control(0, 1)) == Status::error);
  CHECK(contains(router.last_error(), "no control handler"));
  router.set_control_handler([](uint32_t, uint32_t) { return Status::error; });
  CHECK(router.route(imm::encode_control(0, 1)) == Status::error);

  CHECK(router.refuse("not a signal") == Status::error);
  CHECK(router.last_error() == "not a signal");

  CHECK_THROWS_AS(router.attach_counters(bank), Error);
  CHECK_THROWS_AS(router.attach_stream(2, window), Error);
  CHECK_THROWS_AS(router.attach_stream(imm::kMaxStreams, window), Error);
}
