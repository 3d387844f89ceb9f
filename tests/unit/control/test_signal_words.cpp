// SignalWords (control/signal_words.hpp): the words a device stream waits on, counted up by the
// proxies for every write whose immediate names them, whatever order the writes land in.
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "control/signal_router.hpp"
#include "control/signal_words.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

using proxyep::Error;
using proxyep::Status;
using proxyep::control::SignalRouter;
using proxyep::control::SignalWords;
namespace imm = proxyep::control::imm;

TEST_CASE("signal words: a control immediate counts the word it names, through the router") {
  SignalWords words(8);
  CHECK(words.size() == 8);
  CHECK(reinterpret_cast<uintptr_t>(words.word(0)) % 64 == 0);
  CHECK(words.bytes().size() >= 64);
  SignalRouter router;
  router.attach_words(words);
  for (uint32_t i = 0; i < 8; ++i)
    CHECK(*words.word(i) == 0);
  REQUIRE(router.route(SignalWords::imm_for(3)) == Status::ok);
  REQUIRE(router.route(SignalWords::imm_for(3)) == Status::ok);
  REQUIRE(router.route(SignalWords::imm_for(7)) == Status::ok);
  CHECK(*words.word(3) == 2);
  CHECK(*words.word(7) == 1);
  CHECK(*words.word(0) == 0);
  CHECK(imm::decode(SignalWords::imm_for(5)).op() == imm::Op::control);

  // A word that does not exist: refused, nothing counted, the router names the immediate.
  CHECK(router.route(SignalWords::imm_for(8)) == Status::error);
  CHECK(router.last_error().find("signal word 8 does not exist (there are 8)") !=
        std::string::npos);
  CHECK(router.last_error().find("control") != std::string::npos);
  CHECK_THROWS_AS(router.attach_words(words), Error);
}

TEST_CASE("signal words: sizes an immediate cannot name are refused") {
  CHECK_THROWS_WITH_AS(SignalWords(0), doctest::Contains("an immediate names 1 .."), Error);
  CHECK_THROWS_AS(SignalWords(imm::PayloadField::kMax + 2), Error);
}

TEST_CASE("signal words: proxy threads count at once, none lost") {
  SignalWords words(4);
  SignalRouter router;
  router.attach_words(words);
  constexpr int kThreads = 4, kEach = 5000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i)
        if (router.route(SignalWords::imm_for(static_cast<uint32_t>((t + i) % 4))) != Status::ok)
          failures.fetch_add(1);
    });
  for (auto& thread : threads)
    thread.join();
  CHECK(failures.load() == 0);
  uint64_t total = 0;
  for (uint32_t i = 0; i < 4; ++i)
    total += std::atomic_ref<uint64_t>(*words.word(i)).load();
  CHECK(total == uint64_t{kThreads} * kEach);
  CHECK(*words.word(0) == uint64_t{kThreads} * kEach / 4);
}

TEST_CASE("signal words: memory smaller than the words is refused") {
  // Memory smaller than the words: one page, one word more than it holds.
  const proxyep::HostMemory page = proxyep::HostMemory::heap(16);
  const auto over = static_cast<uint32_t>(page.size() / 8 + 1);
  const std::string expected =
      fmt::format("{} signal words need {} bytes; the memory has {}", over, 8 * over, page.size());
  CHECK_THROWS_WITH_AS(SignalWords(over, proxyep::HostMemory::heap(16)),
                       doctest::Contains(expected.c_str()), Error);
}
