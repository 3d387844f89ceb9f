// TCP bootstrap, the failure paths: every rank fails, promptly, naming the culprit.
#include "control/bootstrap.hpp"
#include "control/bootstrap_wire.hpp"
#include "tests/unit/control/rank_threads.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <thread>

using namespace proxyep::control;
using namespace proxyep::control::testing;

namespace {

constexpr auto kShort = 1500ms;
// Failures must surface within the timeout plus the client's grace for rank 0's verdict, plus
// scheduling slack on a loaded 2-core machine.
constexpr auto kBound = kShort + 2s;

void check_failed(const RankOutcome& outcome, const std::string& names,
                  std::chrono::milliseconds bound) {
  CAPTURE(outcome.error);
  CHECK_FALSE(outcome.ok);
  CHECK(contains(outcome.error, names));
  CHECK(outcome.elapsed < bound);
}

RankBody connect_and(std::function<void(Bootstrap&)> body) {
  return [body](Bootstrap::Options options) {
    auto boot = Bootstrap::connect(std::move(options));
    body(*boot);
  };
}

}  // namespace

TEST_CASE("bootstrap failure: a rank that never starts is named by every rank that did") {
  std::vector<RankBody> present(3, connect_and([](Bootstrap& boot) { boot.barrier(""); }));
  // World of 4, rank 2 never starts.
  auto outcomes = run_bodies(present, 4, kShort, {0, 1, 3});
  for (const auto& outcome : outcomes) {
    check_failed(outcome, "rank 2 did not arrive within 1500 ms", kBound);
    CHECK(contains(outcome.error, "bootstrap.rendezvous"));
  }
}

TEST_CASE("bootstrap failure: ranks missing from a collective are named, with the phase") {
  std::atomic<int> finished{0};
  auto waiting = connect_and([&](Bootstrap& boot) {
    try {
      boot.allgather(bytes_of("x"), "fabric addresses");
    } catch (...) {
      ++finished;
      throw;
    }
  });
  // Ranks 2 and 3 join the rendezvous but never enter the allgather; they hang on until the
  // others gave up, then leave.
  auto absent = connect_and([&](Bootstrap&) {
    while (finished.load() < 2)
      std::this_thread::sleep_for(5ms);
  });
  auto outcomes = run_bodies({waiting, waiting, absent, absent}, 4, kShort);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    check_failed(outcomes[rank], "ranks 2, 3 did not arrive within 1500 ms", kBound);
    CHECK(contains(outcomes[rank].error, "bootstrap.allgather(fabric addresses)"));
  }
}

TEST_CASE("bootstrap failure: a missing rank 0 is named by the others") {
  std::atomic<int> finished{0};
  auto waiting = connect_and([&](Bootstrap& boot) {
    try {
      boot.barrier("step");
    } catch (...) {
      ++finished;
      throw;
    }
  });
  auto absent = connect_and([&](Bootstrap&) {
    while (finished.load() < 2)
      std::this_thread::sleep_for(5ms);
  });
  auto outcomes = run_bodies({absent, waiting, waiting}, 3, kShort);
  for (int rank : {1, 2})
    check_failed(outcomes[rank], "rank 0 did not join barrier", kBound);
}

TEST_CASE("bootstrap failure: a rank that dies mid-collective fails the others at once") {
  for (int dying : {0, 1, 2}) {
    CAPTURE(dying);
    std::vector<RankBody> bodies(3, connect_and([](Bootstrap& boot) { boot.barrier("step"); }));
    bodies[dying] = [](Bootstrap::Options options) {
      auto boot = Bootstrap::connect(std::move(options));
      std::this_thread::sleep_for(100ms);  // the others are in the barrier by now
      boot.reset();                        // the process "dies": its sockets close
    };
    auto outcomes = run_bodies(bodies, 3, 20s);
    for (int rank = 0; rank < 3; ++rank) {
      if (rank == dying) continue;
      CAPTURE(rank);
      // Far sooner than the 20 s timeout: the closed connection is the news.
      check_failed(outcomes[rank], fmt::format("rank {} closed its bootstrap connection", dying),
                   3s);
    }
  }
}

TEST_CASE("bootstrap failure: nobody listening at MASTER_ADDR:MASTER_PORT") {
  int port = find_free_loopback_port();
  auto start = std::chrono::steady_clock::now();
  try {
    Bootstrap::connect(loopback_options(1, 2, port, 500ms));
    FAIL("connected to nobody");
  } catch (const proxyep::Error& e) {
    std::string what = e.what();
    CAPTURE(what);
    CHECK(e.phase() == "bootstrap.rendezvous");
    CHECK(contains(what,
                   fmt::format("rank 0 (rendezvous server at 127.0.0.1:{}) unreachable", port)));
    CHECK(contains(what, "refused"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 2s);
}

TEST_CASE("bootstrap failure: rank 0 cannot listen on a port that is held") {
  std::string error;
  int code = 0;
  Socket holder = listen_tcp("127.0.0.1", 0, 1, error, code);
  REQUIRE(holder.valid());
  int port = local_port(holder.fd());
  auto start = std::chrono::steady_clock::now();
  try {
    Bootstrap::connect(loopback_options(0, 2, port, 10s));
    FAIL("listened on a held port");
  } catch (const proxyep::Error& e) {
    std::string what = e.what();
    CAPTURE(what);
    CHECK(contains(what, fmt::format("rank 0 cannot serve the rendezvous at 127.0.0.1:{}", port)));
    CHECK(contains(what, "Address already in use"));
  }
  // A held port fails after a short retry, not after the whole timeout.
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("bootstrap failure: two processes claiming one rank fail the world promptly") {
  auto body = connect_and([](Bootstrap& boot) { boot.barrier(""); });
  // World of 3 with rank 1 twice (and so no rank 2). Timeout long: the error must not wait.
  auto outcomes = run_bodies({body, body, body}, 3, 20s, {0, 1, 1});
  for (const auto& outcome : outcomes)
    check_failed(outcome, "two processes claim rank 1", 5s);
}

TEST_CASE("bootstrap failure: a different WORLD_SIZE is named") {
  std::vector<RankBody> bodies = {connect_and([](Bootstrap& boot) { boot.barrier(""); }),
                                  [](Bootstrap::Options options) {
                                    options.env.world_size = 3;
                                    options.env.local_world_size = 3;
                                    Bootstrap::connect(std::move(options));
                                  }};
  auto outcomes = run_bodies(bodies, 2, 20s);
  for (const auto& outcome : outcomes)
    check_failed(outcome, "was started with WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2", 5s);
}

TEST_CASE("bootstrap failure: ranks calling different collectives get an error, not a mix-up") {
  SUBCASE("different operation") {
    std::vector<RankBody> bodies = {
        connect_and([](Bootstrap& boot) { boot.barrier("sync"); }),
        connect_and([](Bootstrap& boot) { boot.allgather(bytes_of("x"), "sync"); })};
    for (const auto& outcome : run_bodies(bodies, 2, 20s))
      check_failed(outcome, "every rank must call the same collectives", 5s);
  }
  SUBCASE("different phase text") {
    std::vector<RankBody> bodies = {connect_and([](Bootstrap& boot) { boot.barrier("before"); }),
                                    connect_and([](Bootstrap& boot) { boot.barrier("after"); })};
    auto outcomes = run_bodies(bodies, 2, 20s);
    for (const auto& outcome : outcomes)
      check_failed(outcome, "barrier('after')", 5s);
  }
  SUBCASE("different broadcast root") {
    std::vector<RankBody> bodies = {
        connect_and([](Bootstrap& boot) { boot.broadcast(bytes_of("x"), 0, "root"); }),
        connect_and([](Bootstrap& boot) { boot.broadcast(bytes_of("x"), 1, "root"); })};
    for (const auto& outcome : run_bodies(bodies, 2, 20s))
      check_failed(outcome, "every rank must call the same collectives", 5s);
  }
}

TEST_CASE("bootstrap failure: after a failure every call repeats it at once") {
  std::vector<std::string> second(2);
  std::vector<RankBody> bodies = {
      connect_and([&](Bootstrap& boot) {
        try {
          boot.barrier("one");
        } catch (const proxyep::Error&) {
        }
        try {
          boot.barrier("two");
        } catch (const proxyep::Error& e) {
          second[0] = e.what();
        }
      }),
      connect_and([](Bootstrap& boot) { boot.allgather(bytes_of("x"), "one"); })};
  run_bodies(bodies, 2, 20s);
  CHECK(contains(second[0], "bootstrap.barrier(two)"));
  CHECK(contains(second[0], "unusable after an earlier failure"));
}

TEST_CASE("bootstrap failure: a progress hook that throws fails its rank and is reported") {
  std::vector<RankBody> bodies = {
      // Rank 1's contribution may reach rank 0 before its hook throws, completing the first
      // barrier; then the second one reports the failure.
      connect_and([](Bootstrap& boot) {
        boot.barrier("hook");
        boot.barrier("hook");
      }),
      [](Bootstrap::Options options) {
        auto boot = Bootstrap::connect(std::move(options));
        boot->set_progress([] { throw proxyep::Error("fabric.progress", "CQ error from rank 0"); });
        std::this_thread::sleep_for(50ms);
        boot->barrier("hook");
      }};
  auto outcomes = run_bodies(bodies, 2, 20s);
  check_failed(outcomes[1], "CQ error from rank 0", 5s);
  check_failed(outcomes[0], "rank 1 failed: fabric.progress: CQ error from rank 0", 5s);
}

TEST_CASE("bootstrap: a stray connection during the rendezvous is ignored") {
  int port = find_free_loopback_port();
  std::thread stray([port] {
    // Keep knocking until rank 0 listens, then send something that is not a handshake.
    for (int attempt = 0; attempt < 200; ++attempt) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        const char junk[] = "GET / HTTP/1.0\r\n\r\n and some more bytes";
        (void)!::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
        std::this_thread::sleep_for(50ms);
        ::close(fd);
        return;
      }
      ::close(fd);
      std::this_thread::sleep_for(5ms);
    }
  });
  std::vector<RankOutcome> outcomes(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        // Rank 1 arrives after the stray has been screened.
        if (rank == 1) std::this_thread::sleep_for(150ms);
        auto boot = Bootstrap::connect(loopback_options(rank, 2, port, 10s));
        boot->barrier("after stray");
        outcomes[rank].ok = true;
      } catch (const std::exception& e) {
        outcomes[rank].error = e.what();
      }
    });
  }
  for (auto& thread : ranks)
    thread.join();
  stray.join();
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.ok, outcome.error);
}

TEST_CASE("liveness: a rank that leaves cleanly is not reported as gone") {
  // Its goodbye and the end of its connection usually arrive together; a monitor that looked at
  // the end before the goodbye reported "closed without a goodbye" (and failed waits on it).
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    std::vector<RankBody> bodies(3, [](Bootstrap::Options options) {
      auto boot = Bootstrap::connect(std::move(options));
      boot->barrier("start");
      const int rank = boot->rank();
      if (rank == 0) return;  // leaves at once, cleanly: the others hear its goodbye
      std::this_thread::sleep_for(200ms);
      const PeerWatch* watch = boot->peer_watch();
      if (watch == nullptr) throw std::runtime_error("no liveness watch");
      if (auto gone = watch->failure())
        throw std::runtime_error(
            fmt::format("rank {} reported as gone: {}", gone->rank, gone->reason));
    });
    for (const auto& outcome : run_bodies(bodies, 3, 10s)) {
      CAPTURE(outcome.error);
      CHECK(outcome.ok);
    }
  }
}

TEST_CASE(
    "bootstrap: a barrier given its own timeout waits that long; the next keeps the default") {
  // The bootstrap's timeout is 1.5 s and rank 2 comes 2.5 s late to both barriers: the first,
  // given 8 s, passes; the second, with the default, fails naming rank 2.
  std::vector<RankBody> bodies(3);
  for (int rank = 0; rank < 3; ++rank)
    bodies[rank] = connect_and([rank](Bootstrap& boot) {
      if (rank == 2) std::this_thread::sleep_for(2500ms);
      boot.barrier("connections", 8s);
      if (rank == 2) std::this_thread::sleep_for(2500ms);
      boot.barrier("after");
    });
  auto outcomes = run_bodies(bodies, 3, kShort);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    CAPTURE(outcomes[rank].error);
    CHECK_FALSE(outcomes[rank].ok);
    CHECK(contains(outcomes[rank].error, "barrier(after)"));  // the first barrier passed
  }
  CHECK(contains(outcomes[0].error, "rank 2 did not arrive within 1500 ms"));
  auto zero =
      run_bodies({connect_and([](Bootstrap& boot) { boot.barrier("zero", 0ms); })}, 1, kShort);
  CHECK(contains(zero[0].error, "timeout must be positive"));
}
