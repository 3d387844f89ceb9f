// The signal relay (proxy/engine/signal_relay.hpp) on its own: a relay ring in a memfd the "client"
// creates and the "daemon" maps a second time, as proxy/session/proxy_host_daemon.cpp and
// daemon/served_rank.cpp do. The daemon's side is a RelaySender (its proxy threads' sink); the
// client's is a RelayReceiver draining into its own SignalRouter with a counter bank, a sequence
// window, sender credits and a control handler attached. Every wait is a poll with a deadline.
#include "common/deadline.hpp"
#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/imm_layout.hpp"
#include "control/sequence_window.hpp"
#include "control/signal_router.hpp"
#include "control/signal_words.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/signal_relay.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace std::chrono_literals;
using proxyep::control::CounterBank;
using proxyep::control::SenderCredits;
using proxyep::control::SequenceWindow;
using proxyep::control::SignalRouter;
using proxyep::control::SignalWords;
namespace imm = proxyep::control::imm;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The relay ring as a session lays it out (single producer, in a memfd), mapped twice.
struct RelayRing {
  explicit RelayRing(uint64_t slots)
      : client_memory(HostMemory::memfd(gpu_side::Ring::bytes_for(slots), "proxyep-test-relay")),
        client(
            gpu_side::Ring::create(client_memory.bytes(), slots, gpu_side::ProducerMode::single)),
        daemon_memory(HostMemory::map_fd(client_memory.fd())),
        daemon(gpu_side::Ring::attach(daemon_memory.bytes())) {}
  HostMemory client_memory;
  gpu_side::Ring client;  // the receiver's view
  HostMemory daemon_memory;
  gpu_side::Ring daemon;  // the sender's view
};

// A control handler that keeps the payloads it is handed, in order.
void keep_controls(SignalRouter& router, std::vector<uint32_t>& controls) {
  router.set_control_handler([&controls](uint32_t, uint32_t payload) {
    controls.push_back(payload);
    return Status::ok;
  });
}

}  // namespace

TEST_CASE("signal relay: the daemon's immediates reach the client's router in order") {
  RelayRing ring(256);
  CounterBank bank(16);
  SequenceWindow window(8);
  SenderCredits credits(8);
  SignalRouter client;
  client.attach_counters(bank);
  client.attach_stream(3, window);
  client.attach_credits(5, credits);
  std::vector<uint32_t> controls;
  keep_controls(client, controls);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  RelaySender& daemon = sender;  // the daemon's proxy threads route into it

  REQUIRE(bank.set_expected(0, 9, 3) == Status::ok);
  uint16_t seq = 0;
  for (int i = 0; i < 8; ++i)
    REQUIRE(credits.acquire(seq) == Status::ok);
  REQUIRE(credits.available() == 0);

  const std::vector<uint32_t> sent = {
      imm::encode_control(0, 100), imm::encode_counter(0, 9),   imm::encode_stream(0, 3, 1),
      imm::encode_control(0, 101), imm::encode_counter(0, 9),   imm::encode_stream(2, 3, 0),
      imm::encode_credit(0, 5, 6), imm::encode_control(0, 102), imm::encode_counter(1, 9),
      imm::encode_control(3, 103),
  };
  // The epoch tag of the last counter is 1 (epoch 1 is inside the bank's window): it counts
  // toward epoch 1, not 0, so key 9 of epoch 0 sees 2 of its 3.
  for (uint32_t raw : sent)
    REQUIRE(daemon.route(raw) == Status::ok);
  CHECK(sender.relayed() == sent.size());

  // Nothing reaches the client's targets before it drains.
  CHECK(receiver.received() == 0);
  CHECK(controls.empty());
  CHECK(window.tail() == 0);
  CHECK(credits.available() == 0);
  CHECK_FALSE(bank.ready(0, 9));

  REQUIRE_MESSAGE(receiver.drain() == Status::ok, client.last_error());
  CHECK(receiver.received() == sent.size());
  CHECK(controls == std::vector<uint32_t>{100, 101, 102, 103});
  CHECK(window.tail() == 2);        // seq 1 then seq 0: the prefix is complete
  CHECK(credits.available() == 6);  // the credit carried tail 6
  CHECK_FALSE(bank.ready(0, 9));    // 2 of 3 in epoch 0
  REQUIRE(bank.set_expected(1, 9, 1) == Status::ok);
  CHECK(bank.ready(1, 9));  // the one of epoch 1 was counted there
  REQUIRE(daemon.route(imm::encode_counter(0, 9)) == Status::ok);
  REQUIRE(receiver.drain() == Status::ok);
  CHECK(bank.ready(0, 9));
  CHECK(bank.errors() == 0);

  // A drain with nothing relayed routes nothing.
  REQUIRE(receiver.drain() == Status::ok);
  CHECK(receiver.received() == sent.size() + 1);
  CHECK(controls.size() == 4);
}

TEST_CASE("signal relay: one drain routes more than a burst, in relay order") {
  RelayRing ring(512);
  SignalRouter client;
  std::vector<uint32_t> controls;
  keep_controls(client, controls);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  constexpr uint32_t kCount = 300;  // several of the receiver's 64-slot bursts
  for (uint32_t i = 0; i < kCount; ++i)
    REQUIRE(sender.route(imm::encode_control(0, i)) == Status::ok);
  REQUIRE(receiver.drain() == Status::ok);
  CHECK(receiver.received() == kCount);
  REQUIRE(controls.size() == kCount);
  bool in_order = true;
  for (uint32_t i = 0; i < kCount; ++i)
    in_order = in_order && controls[i] == i;
  CHECK(in_order);
}

TEST_CASE("signal relay: a full ring refuses the immediate, says the client stopped draining") {
  constexpr uint64_t kSlots = 8;
  RelayRing ring(kSlots);
  CounterBank bank(4);
  SignalRouter client;
  client.attach_counters(bank);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  RelaySender& daemon = sender;  // the daemon's proxy threads route into it
  // Key 1 expects exactly kSlots + 1 arrivals: a refused immediate that still landed in the
  // ring would make one too many (an error at the drain), one that was lost would leave the
  // flag down.
  REQUIRE(bank.set_expected(0, 1, kSlots + 1) == Status::ok);

  for (uint64_t i = 0; i < kSlots; ++i)
    REQUIRE(sender.route(imm::encode_counter(0, 1)) == Status::ok);
  CHECK(sender.last_error().empty());
  CHECK(sender.route(imm::encode_counter(0, 1)) == Status::error);
  CHECK(contains(sender.last_error(), "the client stopped draining"));
  CHECK(sender.relayed() == kSlots);
  // Again: the route fails naming the immediate and the reason.
  CHECK(daemon.route(imm::encode_counter(0, 1)) == Status::error);
  CHECK(contains(daemon.last_error(), fmt::format("imm {:#010x}", imm::encode_counter(0, 1))));
  CHECK(contains(daemon.last_error(), "the client stopped draining"));
  CHECK(sender.relayed() == kSlots);

  REQUIRE_MESSAGE(receiver.drain() == Status::ok, client.last_error());
  CHECK(receiver.received() == kSlots);
  CHECK_FALSE(bank.ready(0, 1));

  // Drained: the relay takes immediates again.
  REQUIRE(daemon.route(imm::encode_counter(0, 1)) == Status::ok);
  CHECK(sender.relayed() == kSlots + 1);
  REQUIRE_MESSAGE(receiver.drain() == Status::ok, client.last_error());
  CHECK(receiver.received() == kSlots + 1);
  CHECK(bank.ready(0, 1));
  CHECK(bank.errors() == 0);
  // And it can be filled to the brim again (the ring's positions stayed exact).
  for (uint64_t i = 0; i < kSlots; ++i)
    REQUIRE(sender.route(imm::encode_control(0, 1)) == Status::ok);
  CHECK(sender.route(imm::encode_control(0, 1)) == Status::error);
  CHECK(sender.relayed() == 2 * kSlots + 1);
}

TEST_CASE("signal relay: an immediate the client's router refuses fails the drain, naming it") {
  RelayRing ring(64);
  CounterBank bank(4);
  SignalRouter client;
  client.attach_counters(bank);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  REQUIRE(bank.set_expected(0, 1, 1) == Status::ok);
  REQUIRE(bank.set_expected(0, 2, 1) == Status::ok);

  REQUIRE(sender.route(imm::encode_counter(0, 1)) == Status::ok);
  REQUIRE(sender.route(imm::encode_stream(0, 7, 4)) == Status::ok);  // no window on stream 7
  CHECK(receiver.drain() == Status::error);
  CHECK(contains(client.last_error(), "stream, stream 7, seq 4"));
  CHECK(contains(client.last_error(), "no sequence window attached"));
  CHECK(bank.ready(0, 1));  // routed before the refused one

  // The next drain routes what was relayed since.
  REQUIRE(sender.route(imm::encode_counter(0, 2)) == Status::ok);
  REQUIRE_MESSAGE(receiver.drain() == Status::ok, client.last_error());
  CHECK(bank.ready(0, 2));
  CHECK(bank.errors() == 0);
}

// The refused immediate's burst was already popped (its slots freed): the receiver keeps the
// rest of it and routes them first on the next drain.
TEST_CASE("signal relay: the immediates behind a refused one stay for the next drain") {
  RelayRing ring(64);
  CounterBank bank(4);
  SignalRouter client;
  client.attach_counters(bank);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  REQUIRE(bank.set_expected(0, 1, 1) == Status::ok);
  REQUIRE(bank.set_expected(0, 2, 2) == Status::ok);

  REQUIRE(sender.route(imm::encode_counter(0, 1)) == Status::ok);
  REQUIRE(sender.route(imm::encode_stream(0, 7, 4)) == Status::ok);  // refused
  REQUIRE(sender.route(imm::encode_counter(0, 2)) == Status::ok);
  REQUIRE(sender.route(imm::encode_counter(0, 2)) == Status::ok);
  CHECK(receiver.drain() == Status::error);
  CHECK(contains(client.last_error(), "stream 7"));
  CHECK(bank.ready(0, 1));
  CHECK_FALSE(bank.ready(0, 2));

  CHECK(receiver.received() == 2);  // the counter and the refused one
  CHECK(receiver.drain() == Status::ok);
  CHECK(bank.ready(0, 2));
  CHECK(receiver.received() == 4);
}

// Also under ThreadSanitizer (unit.proxy carries the tsan label): the sender's mutex around
// the single producer, the ring's release/acquire pairs across the two mappings, and the
// client's router and counter bank.
TEST_CASE("signal relay: 4 proxy threads relay 50k immediates each while the client drains") {
  constexpr uint32_t kThreads = 4;
  constexpr uint32_t kPerThread = 50'000;
  constexpr uint32_t kKeysPerThread = 8;
  constexpr uint64_t kTotal = uint64_t{kThreads} * kPerThread;
  // Even-numbered immediates of a thread are counters over its keys, odd ones are controls
  // carrying (thread, index) so the client can check each thread's order.
  constexpr uint32_t kCountersPerKey = kPerThread / 2 / kKeysPerThread;
  static_assert(kPerThread % (2 * kKeysPerThread) == 0);

  // The session's ring, which the client keeps up with, and a small one that the senders fill
  // again and again: their refused immediates must not count and their retries must land once.
  uint64_t slots = kRelaySlots;
  SUBCASE("the session's 64 Ki slots") {
    slots = kRelaySlots;
  }
  SUBCASE("256 slots, full most of the time") {
    slots = 256;
  }
  CAPTURE(slots);
  RelayRing ring(slots);
  CounterBank bank(kThreads * kKeysPerThread);
  SignalRouter client;
  client.attach_counters(bank);
  std::vector<uint32_t> next_control(kThreads, 0);
  uint64_t out_of_order = 0;
  client.set_control_handler([&](uint32_t, uint32_t payload) {
    const uint32_t thread = payload >> 20;
    const uint32_t index = payload & ((1u << 20) - 1);
    if (thread >= kThreads || index != next_control[thread]) {
      ++out_of_order;
      return Status::error;
    }
    ++next_control[thread];
    return Status::ok;
  });
  for (uint32_t key = 0; key < kThreads * kKeysPerThread; ++key)
    REQUIRE(bank.set_expected(0, key, kCountersPerKey) == Status::ok);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  RelaySender& daemon = sender;  // the daemon's proxy threads route into it

  const Deadline deadline(30s);
  std::atomic<uint64_t> gave_up{0};
  std::atomic<uint64_t> refused{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < kPerThread; ++i) {
        const uint32_t raw =
            i % 2 == 0 ? imm::encode_counter(0, t * kKeysPerThread + (i / 2) % kKeysPerThread)
                       : imm::encode_control(0, t << 20 | i / 2);
        // A full ring is an error the daemon would fail the client for; here the client is
        // draining, so retry until it has made room (or the deadline says it never will).
        while (daemon.route(raw) != Status::ok) {
          refused.fetch_add(1, std::memory_order_relaxed);
          if (deadline.expired()) {
            gave_up.fetch_add(1);
            return;
          }
          std::this_thread::yield();
        }
      }
    });

  std::string drain_error;
  while (receiver.received() < kTotal && !deadline.expired()) {
    const uint64_t before = receiver.received();
    if (receiver.drain() != Status::ok) {
      drain_error = client.last_error();
      break;
    }
    if (receiver.received() == before) std::this_thread::yield();
  }
  for (auto& thread : threads)
    thread.join();
  if (drain_error.empty()) REQUIRE(receiver.drain() == Status::ok);  // nothing more, no extra

  MESSAGE(refused.load() << " relays found the ring full and were retried");
  CHECK_MESSAGE(drain_error.empty(), drain_error);
  CHECK(gave_up.load() == 0);
  CHECK(sender.relayed() == kTotal);
  CHECK(receiver.received() == kTotal);
  CHECK(out_of_order == 0);
  CHECK(next_control == std::vector<uint32_t>(kThreads, kPerThread / 2));
  uint32_t raised = 0;
  for (uint32_t key = 0; key < kThreads * kKeysPerThread; ++key)
    raised += bank.ready(0, key) ? 1 : 0;
  CHECK(raised == kThreads * kKeysPerThread);
  CHECK(bank.errors() == 0);
}

// The node daemon relays a client's immediates, but counts its signal words itself: a captured
// graph waits on them with no client thread relaying (proxy/session/proxy_host_daemon.hpp).
TEST_CASE("signal relay: the sender counts attached words itself and relays everything else") {
  RelayRing ring(64);
  CounterBank bank(4);
  SignalRouter client;
  client.attach_counters(bank);
  std::vector<uint32_t> controls;
  keep_controls(client, controls);
  RelayReceiver receiver(ring.client, client);
  RelaySender sender(ring.daemon);
  const HostMemory shared = HostMemory::memfd(SignalWords::bytes_for(4), "words");
  // The words in memory another process mapped: counted there, read here.
  SignalWords words(4, HostMemory::map_fd(shared.fd()));
  const uint32_t counter = imm::encode_counter(0, 2);
  REQUIRE(bank.set_expected(0, 2, 2) == Status::ok);
  REQUIRE(sender.route(counter) == Status::ok);
  REQUIRE(sender.route(SignalWords::imm_for(2)) == Status::ok);  // no words yet: relayed
  sender.attach_words(words);
  CHECK_THROWS_AS(sender.attach_words(words), Error);  // once
  REQUIRE(sender.route(SignalWords::imm_for(2)) == Status::ok);
  REQUIRE(sender.route(SignalWords::imm_for(2)) == Status::ok);
  REQUIRE(sender.route(counter) == Status::ok);
  CHECK(sender.relayed() == 3);
  CHECK(static_cast<const uint64_t*>(shared.host())[2] == 2);
  CHECK(sender.route(SignalWords::imm_for(4)) == Status::error);  // still checked
  CHECK(contains(sender.last_error(), "control"));
  REQUIRE_MESSAGE(receiver.drain() == Status::ok, client.last_error());
  CHECK(receiver.received() == 3);
  CHECK(bank.ready(0, 2));
  CHECK(controls.size() == 1);  // the word's immediate sent before the words were attached
}
