// A proxy thread stuck inside the provider (as on shm when a dead peer held a lock in shared
// memory) while its session goes away: stop() detaches it after ProxyEngine::kStopTimeout, and
// the session must keep everything the thread may still touch. Here the "provider" is a rail
// decorator whose poll() blocks until the test lets it go, after the session was destroyed; the
// rail then checks, without touching its own memory, whether it was destroyed meanwhile (what
// the real provider would do as a use after free: the SIGSEGV in pthread_spin_lock seen in CI).
#include "proxy/session/session.hpp"

#include "common/error.hpp"
#include "tests/unit/control/rank_threads.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"
#include "tests/unit/proxy/stuck_rail.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace proxyep;
using namespace std::chrono_literals;

namespace {

// Outlives everything (the stuck thread reads it after the session is gone).
struct Gate {
  std::atomic<bool> armed{false};
  std::atomic<bool> inside{false};           // a proxy thread is blocked in poll()
  std::atomic<bool> rail_destroyed{false};   // the stuck rail's destructor ran
  std::atomic<bool> used_after_free{false};  // it came back to a destroyed rail
  std::atomic<bool> returned{false};         // it came back at all
};
Gate gate;

class StuckRail final : public proxy::testing::ForwardingRail {
 public:
  explicit StuckRail(std::unique_ptr<fabric::Transport> inner) : ForwardingRail(std::move(inner)) {}
  ~StuckRail() override { gate.rail_destroyed = true; }

  [[nodiscard]] Status poll(std::span<fabric::Completion> out, size_t& count) override {
    if (gate.armed) {
      gate.inside = true;
      while (gate.armed)
        std::this_thread::sleep_for(1ms);
      gate.returned = true;
      // Only the global gate may be read here: `this` may be gone.
      if (gate.rail_destroyed) {
        gate.used_after_free = true;
        count = 0;
        return Status::ok;
      }
    }
    return inner_->poll(out, count);
  }
};

}  // namespace

TEST_CASE("a session whose proxy thread is stuck in the provider keeps what the thread uses") {
  std::vector<control::testing::RankBody> bodies;
  for (int r = 0; r < 2; ++r)
    bodies.push_back([](control::Bootstrap::Options options) {
      auto boot = control::Bootstrap::connect(options);
      proxy::SessionConfig config;
      config.sizes = {.ranks = 2,
                      .ranks_per_node = 1,  // two "nodes": rank 0 runs a proxy over the fabric
                      .record_bytes = 128,
                      .eager_bytes = 0,
                      .data_bytes = 64 << 10,
                      .staging_bytes = 64 << 10,
                      .chunk_bytes = 4096};
      config.timeout = 10s;
      config.fabric = fabric::testing::options_for("shm", boot->rank());
      if (boot->rank() == 0)
        config.fabric->wrap_rail = [](std::unique_ptr<fabric::Transport> rail) {
          return std::make_unique<StuckRail>(std::move(rail));
        };
      proxy::EngineOptions engine;
      engine.placement.pin = false;
      config.engine = engine;
      auto session = proxy::Session::open(*boot, config);
      boot->barrier("test(open)");
      if (boot->rank() == 0) {
        gate.armed = true;
        const auto until = std::chrono::steady_clock::now() + 5s;
        while (!gate.inside && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(1ms);
        require(gate.inside.load(), "test", "no proxy thread entered poll()");
        session.reset();  // stop() gives up on the stuck thread after kStopTimeout
        gate.armed = false;
        const auto back = std::chrono::steady_clock::now() + 5s;
        while (!gate.returned && std::chrono::steady_clock::now() < back)
          std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);  // its next steps, had anything been freed
      }
      boot->barrier("test(done)");
    });
  auto outcomes = control::testing::run_bodies(bodies, 2, 30000ms);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].ok);
  }
  CHECK(gate.returned);
  CHECK_FALSE(gate.rail_destroyed);  // kept for the life of the process
  CHECK_FALSE(gate.used_after_free);
}
