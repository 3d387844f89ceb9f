#include "tools/bench/rendezvous_bench.hpp"

#include "common/crypto.hpp"
#include "common/descriptor_limit.hpp"
#include "common/error.hpp"
#include "control/bootstrap.hpp"
#include "control/tcp_socket.hpp"
#include "tools/bench/stats.hpp"
#include "tools/cli_checks.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <string>
#include <thread>

namespace proxyep::tools {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kPhase = "bench.rendezvous";

// Descriptors per rank thread: its connection to rank 0 and rank 0's end of it, the liveness
// star's pair, and rank 0's share of handshakes in flight; plus what the process holds besides.
constexpr uint64_t kDescriptorsPerRank = 6;
constexpr uint64_t kDescriptorsBesides = 256;

// What one rank contributes to the allgather: its rank in every byte's low bits, so a
// misplaced contribution cannot pass the check.
control::Bytes address_of(int rank, size_t bytes) {
  control::Bytes out(bytes);
  for (size_t i = 0; i < bytes; ++i)
    out[i] = static_cast<uint8_t>((rank * 31 + static_cast<int>(i)) & 0xff);
  return out;
}

struct RankTimes {
  double connected_ms = 0, barrier_ms = 0, allgather_ms = 0;  // since the common start
  bool verified = false;
  std::string error;
};

double since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// One world of `world` rank threads, start to allgather; the slowest rank's view of each part.
struct WorldTimes {
  double rendezvous_ms = 0, barrier_ms = 0, allgather_ms = 0;
  bool verified = true;
};

WorldTimes run_world(int world, const RendezvousBenchOptions& options,
                     const std::shared_ptr<const SecretBytes>& secret, const std::string& job) {
  const int port = control::find_free_loopback_port();
  std::vector<RankTimes> times(static_cast<size_t>(world));
  std::latch ready(world + 1);
  Clock::time_point start;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankTimes& mine = times[static_cast<size_t>(r)];
      control::Bootstrap::Options boot;
      boot.env.master_addr = "127.0.0.1";
      boot.env.master_port = port;
      boot.env.rank = r;
      boot.env.world_size = world;
      boot.env.local_rank = r;
      boot.env.local_world_size = world;
      boot.timeout = std::chrono::milliseconds(options.timeout_ms);
      boot.job_id = job;
      boot.secret = secret;
      ready.arrive_and_wait();
      try {
        auto bootstrap = control::Bootstrap::connect(std::move(boot));
        mine.connected_ms = since(start);
        bootstrap->barrier("bench(rendezvous)");
        mine.barrier_ms = since(start);
        const auto all =
            bootstrap->allgather(address_of(r, options.address_bytes), "bench(fabric addresses)");
        mine.allgather_ms = since(start);
        bool ok = all.size() == static_cast<size_t>(world);
        for (int s = 0; ok && s < world; ++s)
          ok = all[static_cast<size_t>(s)] == address_of(s, options.address_bytes);
        mine.verified = ok;
        // Every rank holds its bootstrap until all are done: rank 0 leaving first would read as
        // a lost rank 0 to the others' liveness.
        bootstrap->barrier("bench(done)");
      } catch (const std::exception& e) {
        mine.error = e.what();
      }
    });
  }
  start = Clock::now();
  ready.arrive_and_wait();  // `start` is written before any rank reads it (the latch orders it)
  for (auto& thread : threads)
    thread.join();
  WorldTimes out;
  double connected = 0, barrier = 0, gathered = 0;
  for (const auto& t : times) {
    require(t.error.empty(), kPhase, "{} ranks: {}", world, t.error);
    connected = std::max(connected, t.connected_ms);
    barrier = std::max(barrier, t.barrier_ms);
    gathered = std::max(gathered, t.allgather_ms);
    out.verified = out.verified && t.verified;
  }
  out.rendezvous_ms = connected;
  out.barrier_ms = barrier - connected;
  out.allgather_ms = gathered - barrier;
  return out;
}

nlohmann::json summary_json(const std::vector<double>& samples) {
  const Summary s = summarize(samples);
  return {{"p50", s.p50}, {"p99", s.p99}, {"min", s.min}, {"max", s.max}, {"samples", samples}};
}

}  // namespace

nlohmann::json run_rendezvous_bench(const RendezvousBenchOptions& options) {
  require(!options.ranks.empty() && options.reps >= 1, kPhase, "nothing to run");
  const int largest = *std::max_element(options.ranks.begin(), options.ranks.end());
  reserve_descriptors(kDescriptorsPerRank * static_cast<uint64_t>(largest) + kDescriptorsBesides,
                      kPhase);
  auto secret = std::make_shared<const SecretBytes>(SecretBytes::random_hex(32));
  nlohmann::json worlds = nlohmann::json::array();
  for (int world : options.ranks) {
    require(world >= 2, kPhase, "a world needs at least 2 ranks, got {}", world);
    std::vector<double> rendezvous, barrier, allgather;
    bool verified = true;
    for (int rep = 0; rep < options.reps; ++rep) {
      const auto t =
          run_world(world, options, secret, fmt::format("bench-rendezvous-{}-{}", world, rep));
      rendezvous.push_back(t.rendezvous_ms);
      barrier.push_back(t.barrier_ms);
      allgather.push_back(t.allgather_ms);
      verified = verified && t.verified;
    }
    worlds.push_back({{"ranks", world},
                      {"reps", options.reps},
                      {"rendezvous_ms", summary_json(rendezvous)},
                      {"barrier_ms", summary_json(barrier)},
                      {"allgather_ms", summary_json(allgather)},
                      {"address_bytes", options.address_bytes},
                      {"verified", verified}});
  }
  return {{"bench", "rendezvous"},
          {"ranks_as", "threads of one process, loopback TCP, job id and secret"},
          {"cores", std::thread::hardware_concurrency()},
          {"worlds", worlds}};
}

void print_rendezvous_bench(const nlohmann::json& results) {
  std::printf("%6s %23s %23s %23s %9s\n", "ranks", "rendezvous ms p50/p99", "barrier ms p50/p99",
              "allgather ms p50/p99", "verified");
  for (const auto& w : results["worlds"]) {
    auto pair = [&](const char* key) {
      return fmt::format("{:.1f} / {:.1f}", w[key]["p50"].get<double>(),
                         w[key]["p99"].get<double>());
    };
    std::printf("%6d %23s %23s %23s %9s\n", w["ranks"].get<int>(), pair("rendezvous_ms").c_str(),
                pair("barrier_ms").c_str(), pair("allgather_ms").c_str(),
                w["verified"].get<bool>() ? "yes" : "NO");
  }
}

void register_bench_rendezvous(CLI::App& bench, Action& action) {
  struct Cli {
    RendezvousBenchOptions options;
    bool json = false;
  };
  auto cli = std::make_shared<Cli>();
  auto* cmd = bench.add_subcommand(
      "rendezvous",
      "the bootstrap's rendezvous, barrier and address allgather against the number of ranks "
      "(ranks as threads of this process, loopback)");
  cmd->add_option("--ranks", cli->options.ranks, "world sizes (default 16 64 256 1024)")
      ->check(cli_checks::at_least(2));
  cmd->add_option("--reps", cli->options.reps, "repetitions of each world size")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--address-bytes", cli->options.address_bytes,
                  "bytes each rank contributes to the allgather")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", cli->options.timeout_ms, "every rank's bootstrap.timeout_ms")
      ->check(cli_checks::at_least(1))
      ->capture_default_str();
  cmd->add_flag("--json", cli->json, "print the results as JSON");
  cmd->callback([cli, &action] {
    action = [cli] {
      const auto results = run_rendezvous_bench(cli->options);
      if (cli->json)
        std::printf("%s\n", results.dump(2).c_str());
      else
        print_rendezvous_bench(results);
      bool verified = true;
      for (const auto& w : results["worlds"])
        verified = verified && w["verified"].get<bool>();
      return verified ? 0 : 1;
    };
  });
}

}  // namespace proxyep::tools
