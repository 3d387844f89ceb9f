// Test harness: runs the ranks of one bootstrap world as threads of this process, on a free
// loopback port, and collects what each rank saw (its error text, how long it took) so the
// assertions run on the test's own thread.
#pragma once

#include "common/error.hpp"
#include "control/bootstrap.hpp"
#include "control/tcp_socket.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::control::testing {

using namespace std::chrono_literals;

struct RankOutcome {
  bool ok = false;
  std::string error;  // what() of the exception the rank ended with
  std::chrono::milliseconds elapsed{0};
};

inline LaunchEnv loopback_env(int rank, int world_size, int port) {
  LaunchEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  return env;
}

inline Bootstrap::Options loopback_options(int rank, int world_size, int port,
                                           std::chrono::milliseconds timeout) {
  Bootstrap::Options options;
  options.env = loopback_env(rank, world_size, port);
  options.timeout = timeout;
  return options;
}

// One body per rank; a body receives its rank's options and does everything itself (connect,
// collectives, dying early). Returns one outcome per body.
using RankBody = std::function<void(Bootstrap::Options)>;

inline std::vector<RankOutcome> run_bodies(const std::vector<RankBody>& bodies, int world_size,
                                           std::chrono::milliseconds timeout,
                                           const std::vector<int>& ranks = {}) {
  int port = find_free_loopback_port();
  std::vector<RankOutcome> outcomes(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i) {
    int rank = ranks.empty() ? static_cast<int>(i) : ranks[i];
    threads.emplace_back([&, i, rank] {
      auto start = std::chrono::steady_clock::now();
      try {
        bodies[i](loopback_options(rank, world_size, port, timeout));
        outcomes[i].ok = true;
      } catch (const std::exception& e) {
        outcomes[i].error = e.what();
      }
      outcomes[i].elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
    });
  }
  for (auto& thread : threads)
    thread.join();
  return outcomes;
}

// The same body on every rank 0..world_size-1, given its connected bootstrap.
inline std::vector<RankOutcome> run_ranks(int world_size, std::chrono::milliseconds timeout,
                                          const std::function<void(Bootstrap&)>& body) {
  std::vector<RankBody> bodies(world_size, [&](Bootstrap::Options options) {
    auto bootstrap = Bootstrap::connect(std::move(options));
    body(*bootstrap);
  });
  return run_bodies(bodies, world_size, timeout);
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline Bytes bytes_of(const std::string& text) {
  return Bytes(text.begin(), text.end());
}

}  // namespace proxyep::control::testing
