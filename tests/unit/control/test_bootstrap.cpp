// TCP bootstrap, the working paths: N ranks as threads on 127.0.0.1.
#include "control/bootstrap.hpp"
#include "tests/unit/control/rank_threads.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>

using namespace proxyep::control;
using namespace proxyep::control::testing;

namespace {

Bytes pattern(int rank, size_t size, int round = 0) {
  Bytes bytes(size);
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<uint8_t>(rank * 31 + round * 7 + i);
  return bytes;
}

void check_all_ok(const std::vector<RankOutcome>& outcomes) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    CAPTURE(rank);
    CHECK_MESSAGE(outcomes[rank].ok, outcomes[rank].error);
  }
}

}  // namespace

TEST_CASE("bootstrap: allgather of different sizes, 2 to 4 ranks") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    std::vector<std::vector<Bytes>> seen(world);
    auto outcomes = run_ranks(world, 10s, [&](Bootstrap& boot) {
      CHECK(boot.world_size() == world);
      // Rank 1 contributes nothing; the others 1, 3, 4 ... bytes.
      size_t size = boot.rank() == 1 ? 0 : static_cast<size_t>(boot.rank()) * 2 + 1;
      seen[boot.rank()] = boot.allgather(pattern(boot.rank(), size), "sizes");
    });
    check_all_ok(outcomes);
    for (int rank = 0; rank < world; ++rank) {
      REQUIRE(seen[rank].size() == static_cast<size_t>(world));
      for (int from = 0; from < world; ++from) {
        size_t size = from == 1 ? 0 : static_cast<size_t>(from) * 2 + 1;
        CHECK(seen[rank][from] == pattern(from, size));
      }
    }
  }
}

TEST_CASE("bootstrap: large allgather crosses many socket reads and writes") {
  constexpr size_t kSize = 3 << 20;
  std::vector<int> good(3, 0);  // not vector<bool>: its bits share words across threads
  auto outcomes = run_ranks(3, 20s, [&](Bootstrap& boot) {
    auto all = boot.allgather(pattern(boot.rank(), kSize + boot.rank()), "large");
    bool same = all.size() == 3;
    for (int from = 0; same && from < 3; ++from)
      same = all[from] == pattern(from, kSize + from);
    good[boot.rank()] = same;
  });
  check_all_ok(outcomes);
  CHECK(good == std::vector<int>{1, 1, 1});
}

TEST_CASE("bootstrap: broadcast from every root, and barriers") {
  constexpr int kWorld = 4;
  std::vector<std::vector<Bytes>> got(kWorld);
  auto outcomes = run_ranks(kWorld, 10s, [&](Bootstrap& boot) {
    for (int root = 0; root < kWorld; ++root) {
      // Non-roots pass junk that must be ignored.
      Bytes data = boot.rank() == root ? pattern(root, 100 + root) : Bytes{9, 9, 9};
      got[boot.rank()].push_back(boot.broadcast(data, root, "from each root"));
      boot.barrier("after broadcast");
    }
  });
  check_all_ok(outcomes);
  for (int rank = 0; rank < kWorld; ++rank) {
    REQUIRE(got[rank].size() == static_cast<size_t>(kWorld));
    for (int root = 0; root < kWorld; ++root)
      CHECK(got[rank][root] == pattern(root, 100 + root));
  }
}

TEST_CASE("bootstrap: many consecutive collectives stay matched") {
  constexpr int kWorld = 3;
  constexpr int kRounds = 150;
  std::vector<int> good(kWorld, 0);
  auto outcomes = run_ranks(kWorld, 10s, [&](Bootstrap& boot) {
    for (int round = 0; round < kRounds; ++round) {
      switch (round % 3) {
        case 0: {
          auto all = boot.allgather(pattern(boot.rank(), round % 17, round), "round");
          bool same = true;
          for (int from = 0; from < kWorld; ++from)
            same = same && all[from] == pattern(from, round % 17, round);
          good[boot.rank()] += same;
          break;
        }
        case 1: {
          int root = round % kWorld;
          auto data = boot.broadcast(pattern(root, 5, round), root, "round");
          good[boot.rank()] += data == pattern(root, 5, round);
          break;
        }
        default:
          boot.barrier("round");
          good[boot.rank()] += 1;
      }
    }
  });
  check_all_ok(outcomes);
  CHECK(good == std::vector<int>(kWorld, kRounds));
}

TEST_CASE("bootstrap: the progress hook runs on the waiting thread while it waits") {
  std::atomic<int> calls{0};
  std::atomic<bool> wrong_thread{false};
  std::vector<RankBody> bodies = {
      [&](Bootstrap::Options options) {
        auto boot = Bootstrap::connect(std::move(options));
        std::this_thread::sleep_for(150ms);  // rank 1 waits in the barrier meanwhile
        boot->barrier("late rank 0");
      },
      [&](Bootstrap::Options options) {
        auto me = std::this_thread::get_id();
        auto boot = Bootstrap::connect(std::move(options));
        boot->set_progress([&, me] {
          ++calls;
          if (std::this_thread::get_id() != me) wrong_thread = true;
        });
        boot->barrier("late rank 0");
      }};
  auto outcomes = run_bodies(bodies, 2, 10s);
  check_all_ok(outcomes);
  CHECK(calls.load() >= 20);  // ~150 ms of waiting in slices of at most 10 ms
  CHECK_FALSE(wrong_thread.load());
}

TEST_CASE("bootstrap: the progress hook also runs during the rendezvous") {
  std::atomic<int> calls{0};
  std::vector<RankBody> bodies = {
      [&](Bootstrap::Options options) {
        std::this_thread::sleep_for(100ms);  // rank 1 retries its connection meanwhile
        auto boot = Bootstrap::connect(std::move(options));
        boot->barrier("");
      },
      [&](Bootstrap::Options options) {
        options.progress = [&] { ++calls; };
        auto boot = Bootstrap::connect(std::move(options));
        boot->barrier("");
      }};
  auto outcomes = run_bodies(bodies, 2, 10s);
  check_all_ok(outcomes);
  CHECK(calls.load() >= 10);
}

TEST_CASE("bootstrap: a world of one needs no network") {
  Bootstrap::Options options;
  options.env.world_size = 1;
  options.env.local_world_size = 1;
  auto boot = Bootstrap::connect(std::move(options));
  auto all = boot->allgather(bytes_of("alone"), "solo");
  REQUIRE(all.size() == 1);
  CHECK(all[0] == bytes_of("alone"));
  boot->barrier("solo");
  CHECK(boot->broadcast(bytes_of("x"), 0, "solo") == bytes_of("x"));
  CHECK_THROWS_AS(boot->broadcast(bytes_of("x"), 1, "solo"), proxyep::Error);
}

TEST_CASE(
    "bootstrap: a bad broadcast root is rejected before sending; the bootstrap stays usable") {
  std::vector<std::string> errors(2);
  auto outcomes = run_ranks(2, 10s, [&](Bootstrap& boot) {
    try {
      boot.broadcast(bytes_of("x"), 2, "bad root");
    } catch (const proxyep::Error& e) {
      errors[boot.rank()] = e.what();
    }
    auto data = boot.broadcast(bytes_of("ok"), 1, "good root");
    if (data != bytes_of("ok")) throw std::runtime_error("wrong broadcast data");
  });
  check_all_ok(outcomes);
  for (const auto& error : errors) {
    CHECK(contains(error, "bootstrap.broadcast(bad root)"));
    CHECK(contains(error, "root 2"));
  }
}

TEST_CASE("bootstrap: rank 0 binds bootstrap.interface when given") {
  std::vector<RankBody> bodies(2, [](Bootstrap::Options options) {
    options.listen_address = "127.0.0.1";
    options.env.master_addr = "localhost";  // clients still connect through MASTER_ADDR
    auto boot = Bootstrap::connect(std::move(options));
    boot->barrier("interface");
  });
  check_all_ok(run_bodies(bodies, 2, 10s));
}
